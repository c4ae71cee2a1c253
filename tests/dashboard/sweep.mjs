// Drives the dashboard's sweep page in the system's headless Chromium (playwright-core): open the sweep from the
// sweeps list, read its trials table, the curves (stopped trials grey), the scatter and the compare link.
// Settings from DRIVE_CONFIG (JSON): url, key, sweepId, chromium, outDir. Prints one JSON line with what it saw.
import { join } from "node:path";

import { visit } from "./browser.mjs";

await visit("sweep", async (page, cfg, result, step) => {
  step("sign in");
  await page.goto(`${cfg.url}#/sweeps`);
  await page.fill("#key-input", cfg.key);
  await page.click("#login-form button[type=submit]");

  step("the sweeps list");
  await page.locator(`tr[data-sweep-id="${cfg.sweepId}"] a`).click();

  step("the sweep page");
  await page.waitForSelector("#sweep-detail:not([hidden])");
  await page.waitForFunction(() => Number(document.querySelector("#sweep-curves").dataset.series) > 0);
  result.hash = await page.evaluate(() => location.hash);
  result.rows = await page.$$eval("#sweep-trials tbody tr", (trs) => trs.map((tr) => ({
    trial: tr.dataset.trial, state: tr.dataset.state, greyed: tr.classList.contains("greyed") })));
  result.curves = { series: Number(await page.getAttribute("#sweep-curves", "data-series")),
                    greyed: Number(await page.getAttribute("#sweep-curves", "data-greyed")) };
  result.scatterPoints = Number(await page.getAttribute("#sweep-scatter", "data-points"));
  result.best = await page.textContent("#sweep-best");
  result.compare = await page.getAttribute("#sweep-compare", "href");
  await page.screenshot({ path: join(cfg.outDir, "sweep.png") });

  step("compare the top trials");
  await page.click("#sweep-compare");
  await page.waitForSelector("#compare-view:not([hidden])");
  await page.waitForFunction(() => Number(document.querySelector("#compare-eval").dataset.series) >= 2);
  result.compared = Number(await page.getAttribute("#compare-eval", "data-series"));
});
