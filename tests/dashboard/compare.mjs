// Drives the dashboard's compare view in the system's headless Chromium (playwright-core): tick jobs in the
// table, press Compare, read what the overlay drew. Settings from DRIVE_CONFIG (JSON): url, key, jobIds,
// chromium, outDir. Prints one JSON line with what it saw.
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(join(root, "dashboard", "package.json"));
const { chromium } = require("playwright-core");

const cfg = JSON.parse(process.env.DRIVE_CONFIG);
const profile = mkdtempSync(join(tmpdir(), "torchyard-chromium-"));
const problems = [];
const step = (msg) => process.stderr.write(`[compare] ${msg}\n`);

const context = await chromium.launchPersistentContext(profile, {
  executablePath: cfg.chromium,
  headless: true,
  viewport: { width: 1360, height: 1180 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const result = {};
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(30000);
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push(`console: ${m.text()}`);
  });
  page.on("response", (r) => {
    if (r.status() >= 400) problems.push(`http ${r.status()} ${r.request().method()} ${new URL(r.url()).pathname}`);
  });
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));

  step("sign in");
  await page.goto(cfg.url);
  await page.fill("#key-input", cfg.key);
  await page.click("#login-form button[type=submit]");

  step("tick the jobs");
  for (const id of cfg.jobIds) await page.locator(`tr[data-job-id="${id}"]`).waitFor();
  result.buttonDisabledBefore = await page.isDisabled("#compare-btn");
  await page.check(`input[data-pick="${cfg.jobIds[0]}"]`);
  result.buttonDisabledWithOne = await page.isDisabled("#compare-btn");
  await page.waitForTimeout(2500); // a table refresh in between: the tick must survive it
  for (const id of cfg.jobIds.slice(1)) await page.check(`input[data-pick="${id}"]`);
  result.firstStillTicked = await page.isChecked(`input[data-pick="${cfg.jobIds[0]}"]`);
  result.buttonText = await page.textContent("#compare-btn");
  await page.click("#compare-btn");

  step("the overlay");
  await page.waitForSelector("#compare-view:not([hidden])");
  result.hash = await page.evaluate(() => location.hash);
  await page.waitForFunction(() => Number(document.querySelector("#compare-loss").dataset.series) >= 2);
  for (const key of ["loss", "eval", "throughput"]) {
    const node = `#compare-${key}`;
    result[key] = {
      series: Number(await page.getAttribute(node, "data-series")),
      points: Number(await page.getAttribute(node, "data-points")),
      metric: await page.getAttribute(node, "data-metric"),
    };
  }
  result.legend = await page.$$eval("#compare-legend li", (lis) => lis.map((li) => ({ id: li.dataset.jobId, text: li.textContent })));
  // Each job's line is stroked in its own colour: count the pixels of the first two on the loss canvas.
  result.linePixels = await page.evaluate(() => {
    const canvas = document.querySelector("#compare-loss canvas");
    const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
    const colours = [[37, 99, 235], [249, 115, 22]];
    const counts = colours.map(() => 0);
    for (let i = 0; i < data.length; i += 4) {
      colours.forEach(([r, g, b], k) => {
        if (Math.abs(data[i] - r) < 40 && Math.abs(data[i + 1] - g) < 40 && Math.abs(data[i + 2] - b) < 40 && data[i + 3] > 100) counts[k]++;
      });
    }
    return counts;
  });
  await page.screenshot({ path: join(cfg.outDir, "compare.png") });
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
