// Drives the dashboard's compare view in the system's headless Chromium (playwright-core): tick jobs in the
// table, press Compare, read what the overlay drew. Settings from DRIVE_CONFIG (JSON): url, key, jobIds,
// chromium, outDir. Prints one JSON line with what it saw.
import { join } from "node:path";

import { visit } from "./browser.mjs";

await visit("compare", async (page, cfg, result, step) => {
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
  result.diff = await page.$$eval("#compare-diff tr[data-field]", (trs) => trs.map((tr) => ({
    field: tr.dataset.field, cells: [...tr.querySelectorAll("td")].slice(1).map((td) => td.textContent), shown: !tr.hidden,
  })));
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
});
