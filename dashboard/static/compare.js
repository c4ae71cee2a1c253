// The compare view: several jobs' curves overlaid per metric, and a table of the spec fields that differ
// between them, grouped by section (spec-diff.js decides which).
/* global uPlot */
import { api, quiet } from "./api.js";
import { $, badge, el, toast } from "./dom.js";
import { fmtNum } from "./format.js";
import { specDiff } from "./spec-diff.js";
import { isCurrent, show } from "./view.js";

const COMPARE_COLORS = ["#2563eb", "#f97316", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"];
const COMPARE = {
  loss: { el: "compare-loss", metrics: ["train/loss"] },
  eval: { el: "compare-eval", metrics: ["eval/accuracy", "eval/loss"] }, // the first one the jobs have
  throughput: { el: "compare-throughput", metrics: ["train/samples_per_s", "train/tokens_per_s"] },
};
const COMPARE_METRICS = [...new Set(Object.values(COMPARE).flatMap((c) => c.metrics))];
let compareCharts = [];

export function destroyCompare() {
  for (const p of compareCharts) p.destroy();
  compareCharts = [];
}

async function jobMetrics(id, signal) {
  const series = new Map(COMPARE_METRICS.map((n) => [n, new Map()]));
  let cursor = null;
  do {
    const q = new URLSearchParams({ limit: "10000" });
    for (const n of COMPARE_METRICS) q.append("name", n);
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/jobs/${id}/metrics?${q}`, { signal });
    for (const p of page.items) series.get(p.name)?.set(p.step, p.value);
    cursor = page.next_cursor;
  } while (cursor);
  return series;
}

const colour = (i) => COMPARE_COLORS[i % COMPARE_COLORS.length];

function swatch(i) {
  const s = el("span", { class: "swatch" });
  s.style.background = colour(i);
  return s;
}

export async function openCompare(ids, gen, signal) {
  show("compare-view");
  document.title = "Compare · torchyard";
  $("compare-legend").replaceChildren();
  $("compare-diff").replaceChildren();
  let runs;
  try {
    runs = await Promise.all(ids.map(async (id) => ({ job: await api(`/v1/jobs/${id}`, { signal }), series: await jobMetrics(id, signal) })));
  } catch (err) {
    if (quiet(err)) return;
    toast(err.status === 404 ? "One of these jobs was not found." : `Could not load jobs: ${err.detail}`, "error");
    return;
  }
  if (!isCurrent(gen)) return;
  $("compare-legend").replaceChildren(...runs.map((r, i) => el("li", { dataset: { jobId: r.job.id } }, swatch(i),
    el("a", { href: `#/jobs/${r.job.id}` }, r.job.name), el("span", { class: "mono" }, r.job.id), badge(r.job.status))));
  renderDiff(runs.map((r) => r.job));
  for (const def of Object.values(COMPARE)) drawCompare(def, runs);
}

function renderDiff(jobs) {
  const groups = specDiff(jobs.map((j) => j.spec));
  const table = $("compare-diff");
  if (!groups.length) {
    table.replaceChildren(el("tbody", {}, el("tr", {}, el("td", { class: "empty" }, "The specs are the same."))));
    return;
  }
  const head = el("thead", {}, el("tr", {}, el("th", {}, "Field"),
    ...jobs.map((j, i) => el("th", {}, swatch(i), ` ${j.name} `, el("span", { class: "mono" }, j.id.slice(-6))))));
  const bodies = groups.map(({ group, fields, onlyIn }) => {
    const rows = fields.map((f) => el("tr", { dataset: { field: f.path }, ...(onlyIn ? { hidden: "" } : {}) },
      el("td", { class: "mono" }, f.field),
      ...f.values.map((v) => (v === null ? el("td", { class: "unset" }, "unset") : el("td", { class: "mono" }, v)))));
    const title = [group];
    if (onlyIn) {
      // A section only some jobs have: one line saying whose it is, its fields a click away.
      const whose = onlyIn.map((i) => jobs[i].name).join(", ");
      const toggle = el("button", { type: "button", class: "link-ish", dataset: { unfold: group } }, `show ${fields.length} fields`);
      toggle.addEventListener("click", () => {
        const folded = rows[0].hidden;
        for (const r of rows) r.hidden = !folded;
        toggle.textContent = folded ? "hide" : `show ${fields.length} fields`;
      });
      title.push(el("span", { class: "only-in" }, ` only in ${whose} `), toggle);
    }
    return el("tbody", { dataset: { group, ...(onlyIn ? { onlyIn: onlyIn.join(",") } : {}) } },
      el("tr", { class: "group" }, el("th", { colspan: String(jobs.length + 1) }, ...title)), ...rows);
  });
  table.replaceChildren(head, ...bodies);
}

function drawCompare(def, runs) {
  const node = $(def.el);
  const metric = def.metrics.find((m) => runs.some((r) => r.series.get(m).size)) ?? def.metrics[0];
  const withData = runs.map((r, i) => ({ r, i })).filter(({ r }) => r.series.get(metric).size);
  node.dataset.series = String(withData.length);
  node.dataset.metric = metric;
  if (!withData.length || typeof uPlot === "undefined") {
    // Every job is loaded in full here: a metric none of them has will not come.
    const finished = runs.every((r) => ["succeeded", "failed", "cancelled"].includes(r.job.status));
    node.replaceChildren(el("div", { class: "chart-empty" }, finished ? `none of these jobs recorded ${metric}` : `no ${metric} yet`));
    node.dataset.points = "0";
    return;
  }
  const steps = new Set();
  for (const { r } of withData) for (const s of r.series.get(metric).keys()) steps.add(s);
  const xs = [...steps].sort((a, b) => a - b);
  let count = 0;
  const ys = withData.map(({ r }) => xs.map((s) => {
    const v = r.series.get(metric).get(s);
    if (v === undefined) return null;
    count += 1;
    return v;
  }));
  node.replaceChildren();
  const plot = new uPlot({
    width: Math.max(node.clientWidth, 280), height: 240,
    scales: { x: { time: false } },
    legend: { show: true },
    axes: [{ label: "step", labelSize: 20 }, { size: 60, label: metric, labelSize: 20 }],
    series: [{ label: "step" }, ...withData.map(({ r, i }) => ({
      label: `${r.job.name} ${r.job.id.slice(-6)}`, stroke: colour(i), width: 2, spanGaps: true,
      ...(metric.startsWith("eval/") ? { points: { show: true, size: 5 } } : {}), value: (u, v) => fmtNum(v),
    }))],
  }, [xs, ...ys], node);
  compareCharts.push(plot);
  node.dataset.points = String(count);
}
