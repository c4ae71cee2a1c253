// Drives the dashboard's hosts view, a finished script job's page, a retried job's lineage and the compare view's
// spec diff in the system's headless Chromium (playwright-core). Settings from DRIVE_CONFIG (JSON): url, key,
// chromium, outDir, and the job ids held (running on a GPU), script (a finished script job), catalog (a
// succeeded catalog job) and retry (its retry). Prints one JSON line with what it saw.
import { join } from "node:path";

import { visit } from "./browser.mjs";

await visit("views", async (page, cfg, result, step) => {
  step("sign in");
  await page.goto(cfg.url);
  await page.fill("#key-input", cfg.key);
  await page.click("#login-form button[type=submit]");

  step("jobs table");
  for (const id of [cfg.held, cfg.script, cfg.catalog, cfg.retry]) await page.locator(`tr[data-job-id="${id}"]`).waitFor();
  result.rows = {};
  for (const [what, id] of Object.entries({ held: cfg.held, script: cfg.script, catalog: cfg.catalog })) {
    const row = page.locator(`tr[data-job-id="${id}"]`);
    result.rows[what] = {
      pct: Number(await row.locator(".mini").getAttribute("data-pct")),
      barWidth: await row.locator(".mini .bar").evaluate((b) => b.style.width),
      priority: await row.locator('td[data-col="priority"]').textContent(),
    };
  }
  result.headers = await page.$$eval("#jobs-table thead th", (ths) => ths.map((th) => th.textContent));
  result.barWidths = await page.$$eval("#jobs-table .mini .progress", (bars) => bars.map((b) => Math.round(b.getBoundingClientRect().width)));
  await page.screenshot({ path: join(cfg.outDir, "jobs.png") });

  step("hosts view");
  await page.click('nav a[href="#/hosts"]');
  const host = page.locator('.host[data-host-id="gpu-box"]');
  await host.waitFor();
  await host.locator('.gpu[data-gpu="0"][data-state="held"]').waitFor();
  result.gpus = await host.locator(".gpu").evaluateAll((cells) => cells.map((c) => ({
    index: c.dataset.gpu, state: c.dataset.state, text: c.textContent, link: c.querySelector("a")?.getAttribute("href") ?? null,
  })));
  result.hostMeta = await host.locator(".meta").textContent();
  await page.screenshot({ path: join(cfg.outDir, "hosts.png") });

  step("usage view");
  await page.click('nav a[href="#/usage"]');
  await page.locator('#usage-table tr[data-owner="admin"]').waitFor();
  await page.waitForFunction(() => document.querySelector("#usage-chart canvas"));
  result.usage = {
    rows: await page.$$eval("#usage-table tr", (trs) => trs.map((tr) => ({ owner: tr.dataset.owner, cells: [...tr.cells].map((c) => c.textContent) }))),
    points: Number(await page.getAttribute("#usage-chart", "data-points")),
    owners: await page.getAttribute("#usage-chart", "data-owners"),
  };
  await page.screenshot({ path: join(cfg.outDir, "usage.png") });

  step("a finished script job's page");
  // A preemption's transition, as the scheduler writes it, put into this job's JSON: how the page renders it is what
  // is tested here (real preemptions: tests/priority), without a second job and a wait for its checkpoint.
  await page.route(`**/v1/jobs/${cfg.script}`, async (route) => {
    const job = await (await route.fetch()).json();
    job.transitions.splice(1, 0, { at: job.transitions[0].at, from_status: "running", to_status: "queued", attempt: 1,
      reason: `preempted by job ${cfg.held} (priority 80)` });
    await route.fulfill({ json: job });
  });
  await page.goto(`${cfg.url}#/jobs/${cfg.script}`);
  await page.waitForSelector(`#job-status[data-status="succeeded"]`);
  await page.waitForFunction(() => !document.querySelector("#chart-eval").textContent.includes("waiting"));
  await page.waitForTimeout(4000); // past a poll of the job: nothing turns back to waiting
  result.panels = await page.$$eval(".charts .chart", (nodes) => nodes.map((n) => ({
    id: n.id, points: Number(n.dataset.points), text: n.querySelector(".chart-empty")?.textContent ?? null,
  })));
  result.scriptBar = await page.$eval("#job-progress-bar", (b) => b.style.width);
  result.preemption = await page.$eval("#job-timeline li[data-preempted-by]", (li) => ({
    text: li.querySelector(".reason").textContent, href: li.querySelector(".reason a").getAttribute("href"),
  }));
  await page.screenshot({ path: join(cfg.outDir, "script.png") });

  step("the retried job's lineage");
  await page.goto(`${cfg.url}#/jobs/${cfg.retry}`);
  await page.waitForSelector("#job-lineage:not([hidden]) [data-resumed-from-step]");
  result.lineage = {
    text: await page.textContent("#job-lineage"),
    href: await page.getAttribute("#job-lineage a", "href"),
    step: Number(await page.getAttribute("#job-lineage [data-resumed-from-step]", "data-resumed-from-step")),
  };
  result.timeline = await page.$$eval("#job-timeline li", (lis) => lis.map((li) => li.dataset.to));
  await page.screenshot({ path: join(cfg.outDir, "lineage.png") });
  await page.click("#job-lineage a");
  await page.waitForFunction((id) => location.hash === `#/jobs/${id}`, cfg.catalog);
  await page.waitForFunction((id) => document.querySelector("#job-meta").textContent.startsWith(id), cfg.catalog);
  result.followedTo = await page.evaluate(() => location.hash);

  step("compare a catalog job with a script job");
  await page.goto(`${cfg.url}#/compare/${cfg.catalog},${cfg.script}`);
  await page.waitForSelector("#compare-diff tbody tr[data-field]");
  result.diff = await page.$$eval("#compare-diff tbody", (groups) => groups.map((g) => ({
    group: g.dataset.group,
    onlyIn: g.dataset.onlyIn ?? null,
    shown: [...g.querySelectorAll("tr[data-field]")].filter((tr) => !tr.hidden).length,
    rows: [...g.querySelectorAll("tr[data-field]")].map((tr) => ({
      field: tr.dataset.field, cells: [...tr.querySelectorAll("td")].slice(1).map((td) => td.textContent),
    })),
  })));
  await page.screenshot({ path: join(cfg.outDir, "compare-diff.png"), fullPage: true });
  await page.click('#compare-diff button[data-unfold="train"]');
  result.trainShownAfterClick = await page.$$eval('#compare-diff tbody[data-group="train"] tr[data-field]',
    (trs) => trs.filter((tr) => !tr.hidden).length);
});
