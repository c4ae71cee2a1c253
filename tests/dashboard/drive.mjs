// Drives the dashboard in the system's headless Chromium with playwright-core (which never downloads a
// browser of its own). Run by tests/dashboard/test_dashboard.py; reads its settings from the
// DRIVE_CONFIG environment variable (JSON) and prints one JSON line with what it saw.
//
//   url, key, jobId   the dashboard, an API key, a job that is running and will keep running a while
//   chromium          path of the Chromium binary
//   outDir            where screenshots go
//   screenshotAfterPoints  wait for this many loss points before the job page's screenshot (0: don't wait)
import { join } from "node:path";

import { visit } from "./browser.mjs";

await visit("drive", async (page, cfg, result, step) => {
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
});
