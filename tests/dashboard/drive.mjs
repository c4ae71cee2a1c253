// Drives the dashboard in the system's headless Chromium with playwright-core (which never downloads a
// browser of its own). Run by tests/dashboard/test_dashboard.py; reads its settings from the
// DRIVE_CONFIG environment variable (JSON) and prints one JSON line with what it saw.
//
//   url, key, jobId   the dashboard, an API key, a job that is running and will keep running a while
//   chromium          path of the Chromium binary
//   outDir            where screenshots go
//   screenshotAfterPoints  wait for this many loss points before the job page's screenshot (0: don't wait)
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
const step = (msg) => process.stderr.write(`[drive] ${msg}\n`);

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

  step("sign in");
  await page.goto(cfg.url);
  await page.fill("#key-input", "wrong-key");
  await page.click("#login-form button[type=submit]");
  await page.waitForSelector("#login-error:not([hidden])");
  result.badKeyMessage = await page.textContent("#login-error");
  await page.fill("#key-input", cfg.key);
  await page.click("#login-form button[type=submit]");

  step("jobs table");
  const row = page.locator(`tr[data-job-id="${cfg.jobId}"]`);
  await row.waitFor();
  result.rowStatus = await row.getAttribute("data-status");
  result.rowCount = await page.locator("#jobs-table tbody tr").count();
  await page.screenshot({ path: join(cfg.outDir, "jobs.png") });

  step("open the job");
  await row.click();
  await page.waitForSelector(`#job-status[data-status]`);
  await page.waitForFunction(() => Number(document.querySelector("#chart-loss").dataset.points) >= 2, null, { timeout: 60000 });
  result.pointsFirst = Number(await page.getAttribute("#chart-loss", "data-points"));
  step(`chart has ${result.pointsFirst} points; waiting for live ones`);
  await page.waitForFunction((n) => Number(document.querySelector("#chart-loss").dataset.points) > n, result.pointsFirst, { timeout: 60000 });
  result.pointsLater = Number(await page.getAttribute("#chart-loss", "data-points"));
  result.throughputPoints = Number(await page.getAttribute("#chart-throughput", "data-points"));
  // The train/loss line is stroked in #2563eb: count pixels of that colour on the loss canvas.
  result.linePixels = await page.evaluate(() => {
    const canvas = document.querySelector("#chart-loss canvas");
    const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
    let n = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (Math.abs(data[i] - 37) < 40 && Math.abs(data[i + 1] - 99) < 40 && Math.abs(data[i + 2] - 235) < 40 && data[i + 3] > 100) n++;
    }
    return n;
  });
  result.jobStatusBeforeCancel = await page.getAttribute("#job-status", "data-status");
  // Let a few more points and the ETA settle so the screenshot shows a live job.
  await page.waitForTimeout(1500);
  if (cfg.screenshotAfterPoints) {
    await page.waitForFunction((n) => Number(document.querySelector("#chart-loss").dataset.points) >= n, cfg.screenshotAfterPoints,
      { timeout: 240000 });
  }
  await page.screenshot({ path: join(cfg.outDir, "dashboard.png") });

  step("cancel through the button");
  await page.click("#cancel-btn");
  await page.waitForFunction(() => document.querySelector("#job-status").dataset.status === "cancelled", null, { timeout: 90000 });
  result.finalStatus = await page.getAttribute("#job-status", "data-status");
  result.cancelDisabled = await page.isDisabled("#cancel-btn");
  await page.screenshot({ path: join(cfg.outDir, "cancelled.png") });

  step("retry through the button: a new job opens");
  await page.click("#retry-btn");
  await page.waitForFunction((id) => /^#\/jobs\//.test(location.hash) && !location.hash.endsWith(id), cfg.jobId);
  result.retriedJobId = (await page.evaluate(() => location.hash)).split("/").pop();
  await page.waitForFunction(() => ["queued", "running"].includes(document.querySelector("#job-status").dataset.status));
  result.retriedStatus = await page.getAttribute("#job-status", "data-status");

  step("back to the table");
  await page.click("a.back");
  await page.waitForSelector(`tr[data-job-id="${cfg.jobId}"][data-status="cancelled"]`);
  await page.waitForSelector(`tr[data-job-id="${result.retriedJobId}"]`);
  result.rowStatusAfter = "cancelled";
  result.rowCountAfter = await page.locator("#jobs-table tbody tr").count();
} catch (err) {
  result.error = String(err && err.stack ? err.stack : err);
  try {
    const page = context.pages()[0];
    await page.screenshot({ path: join(cfg.outDir, "failure.png") });
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
