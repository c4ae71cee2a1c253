// The usage view: GPU-hours per owner per UTC day over the last 30 days, from GET /v1/usage (read from the
// attempts' placements and times), as a chart with one line per owner and a table of each owner's totals.
/* global uPlot */
import { api, quiet, routeMissing } from "./api.js";
import { $, el, sleep, toast } from "./dom.js";
import { fmtNum } from "./format.js";
import { isCurrent, show } from "./view.js";

const USAGE_POLL_MS = 30000;
const DAYS = 30;
const COLORS = ["#2563eb", "#f97316", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#4b5563"];
let plot = null;

export function destroyUsage() {
  plot?.destroy();
  plot = null;
}

export async function openUsage(gen, signal) {
  show("usage-view");
  document.title = "Usage · torchyard";
  while (isCurrent(gen)) {
    const since = new Date(Date.now() - DAYS * 86400e3).toISOString().slice(0, 10);
    try {
      const [daily, totals] = await Promise.all([
        api(`/v1/usage?group_by=owner,day&from=${since}`, { signal }),
        api(`/v1/usage?group_by=owner&from=${since}`, { signal }),
      ]);
      if (!isCurrent(gen)) return;
      $("usage-empty").hidden = totals.items.length > 0;
      drawChart(daily.items, Date.parse(`${since}T00:00:00Z`) / 1000);
      $("usage-table").replaceChildren(...totals.items.map(totalRow));
    } catch (err) {
      if (quiet(err)) return;
      if (routeMissing(err)) {
        $("usage-empty").textContent = "This API does not report usage yet.";
        $("usage-empty").hidden = false;
        return;
      }
      if (err.status) toast(`Could not read usage: ${err.detail}`, "error");
    }
    await sleep(USAGE_POLL_MS, signal);
  }
}

const totalRow = (r) => el("tr", { dataset: { owner: r.owner } },
  el("td", { class: "mono" }, r.owner), el("td", { dataset: { col: "gpu_hours" } }, fmtNum(r.gpu_hours)),
  el("td", {}, fmtNum(r.cpu_slot_hours)), el("td", {}, String(r.jobs)), el("td", {}, String(r.attempts)),
  el("td", {}, fmtNum(r.preempted_gpu_hours)));

// The x axis is the whole window, the days with no use included: one day of data must not stretch over years.
function drawChart(items, start) {
  const node = $("usage-chart");
  const days = [...new Set(items.map((r) => r.day))].sort();
  const owners = [...new Set(items.map((r) => r.owner))].sort();
  const xs = days.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000);
  const value = new Map(items.map((r) => [`${r.owner} ${r.day}`, r.gpu_hours]));
  const ys = owners.map((o) => days.map((d) => value.get(`${o} ${d}`) ?? 0));
  node.dataset.points = String(items.length);
  node.dataset.owners = owners.join(",");
  if (typeof uPlot === "undefined" || !owners.length) return;
  destroyUsage();
  node.replaceChildren();
  plot = new uPlot({
    width: Math.max(node.clientWidth, 280),
    height: 260,
    scales: { x: { time: true, range: () => [start, Math.ceil(Date.now() / 86400e3) * 86400] } },
    legend: { show: true },
    axes: [{}, { label: "GPU-hours", labelSize: 20, size: 60 }],
    series: [
      { label: "day", value: (u, v) => (v == null ? "" : new Date(v * 1000).toISOString().slice(0, 10)) },
      ...owners.map((o, i) => ({ label: o, stroke: COLORS[i % COLORS.length], width: 2, points: { show: true, size: 6 },
        value: (u, v) => fmtNum(v) })),
    ],
  }, [xs, ...ys], node);
}
