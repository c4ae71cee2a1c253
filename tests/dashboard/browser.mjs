// Runs one scripted visit of the dashboard in the system's headless Chromium with playwright-core (which
// never downloads a browser of its own): the shared frame of drive.mjs and compare.mjs. Settings come from
// the DRIVE_CONFIG environment variable (JSON; always chromium and outDir). The visit fills `result`; what
// the page reported as errors and any failure are added, and one JSON line is printed.
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(join(root, "dashboard", "package.json"));
const { chromium } = require("playwright-core");

export async function visit(tag, body) {
  const cfg = JSON.parse(process.env.DRIVE_CONFIG);
  const profile = mkdtempSync(join(tmpdir(), "torchyard-chromium-"));
  const problems = [];
  const step = (msg) => process.stderr.write(`[${tag}] ${msg}\n`);
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: cfg.chromium,
    headless: true,
    viewport: { width: 1360, height: 1180 },
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync",
    ],
  });
  const result = {};
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.setDefaultTimeout(30000);
    page.on("console", (m) => {
      // Failed requests are reported below with their URLs; other console errors are the page's own.
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console: ${m.text()}`);
    });
    page.on("response", (r) => {
      if (r.status() >= 400) problems.push(`http ${r.status()} ${r.request().method()} ${new URL(r.url()).pathname}`);
    });
    page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
    page.on("dialog", (d) => d.accept());
    await body(page, cfg, result, step);
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
    try {
      await context.pages()[0].screenshot({ path: join(cfg.outDir, "failure.png") });
    } catch {
      // nothing more to show
    }
  } finally {
    result.problems = problems;
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.error ? 1 : 0);
}
