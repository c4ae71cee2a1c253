// The job page's four charts (uPlot, loaded as a classic script): a chart is built for the series that have
// data and rebuilt when one appears. A panel without data says whether more may come: "waiting for metrics"
// only while the job can still write some.
/* global uPlot */
import { $, el } from "./dom.js";
import { fmtNum } from "./format.js";

const COLORS = ["#2563eb", "#f97316", "#16a34a", "#9333ea"];
// A metric keeps its colour whichever other series are present (the test looks for train/loss's blue).
const CHART_COLOR = { "train/loss": 0, "eval/loss": 1, "eval/accuracy": 2, "train/samples_per_s": 3, "train/tokens_per_s": 3,
  "sys/cpu_percent": 0, "sys/gpu_util": 1 };
export const CHARTS = {
  loss: { el: "chart-loss", what: "loss", series: [["train/loss", "train"], ["eval/loss", "eval"]] },
  eval: { el: "chart-eval", what: "eval accuracy", series: [["eval/accuracy", "accuracy"]] },
  throughput: { el: "chart-throughput", what: "throughput", series: [["train/samples_per_s", "samples/s"], ["train/tokens_per_s", "tokens/s"]] },
  system: { el: "chart-system", what: "system metrics", series: [["sys/cpu_percent", "cpu %"], ["sys/gpu_util", "gpu %"]] },
};
let charts = {}; // key -> {plot, sig}
export let points = new Map(); // metric name -> Map(step -> value)
let redrawPending = false;

const emptyNote = (text) => el("div", { class: "chart-empty", dataset: { empty: "true" } }, text);

export function destroyCharts() {
  for (const c of Object.values(charts)) c.plot.destroy();
  charts = {};
  points = new Map();
  for (const def of Object.values(CHARTS)) {
    const node = $(def.el);
    node.replaceChildren(emptyNote("waiting for metrics…"));
    node.dataset.points = "0";
  }
}

// The job has finished and every point is loaded: panels still empty will stay so; say it.
export function markFinished() {
  for (const [key, def] of Object.entries(CHARTS)) {
    if (def.series.some(([name]) => points.get(name)?.size)) continue;
    $(def.el).replaceChildren(emptyNote(`this job recorded no ${def.what}`));
  }
}

export function addPoint(name, step, value) {
  let series = points.get(name);
  if (!series) points.set(name, (series = new Map()));
  series.set(step, value);
}

export function lastStep() {
  let step = null;
  for (const series of points.values()) for (const s of series.keys()) step = step === null ? s : Math.max(step, s);
  return step;
}

export function latestValue(name) {
  const series = points.get(name);
  if (!series || !series.size) return undefined;
  return series.get(Math.max(...series.keys()));
}

function buildChart(node, present) {
  const opts = {
    width: Math.max(node.clientWidth, 280),
    height: 220,
    scales: { x: { time: false } },
    legend: { show: true },
    cursor: { drag: { x: true, y: false } },
    axes: [{ label: "step", labelSize: 20 }, { size: 60 }],
    series: [
      { label: "step" },
      ...present.map(([name, label]) => ({
        label,
        stroke: COLORS[CHART_COLOR[name] ?? 0],
        width: 2,
        spanGaps: true, // eval points are sparser than train points: join them
        ...(name.startsWith("eval/") ? { points: { show: true, size: 5 } } : {}),
        value: (u, v) => fmtNum(v),
      })),
    ],
  };
  node.replaceChildren();
  return new uPlot(opts, [[], ...present.map(() => [])], node);
}

export function scheduleRedraw() {
  if (redrawPending) return;
  redrawPending = true;
  requestAnimationFrame(() => {
    redrawPending = false;
    redraw();
  });
}

function redraw() {
  if (typeof uPlot === "undefined") return;
  for (const [key, def] of Object.entries(CHARTS)) {
    const present = def.series.filter(([name]) => points.get(name)?.size);
    if (!present.length) continue;
    const node = $(def.el);
    const sig = present.map(([name]) => name).join(",");
    if (charts[key]?.sig !== sig) {
      charts[key]?.plot.destroy();
      charts[key] = { plot: buildChart(node, present), sig };
    }
    const steps = new Set();
    for (const [name] of present) for (const s of points.get(name).keys()) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    let count = 0;
    const ys = present.map(([name]) => {
      const series = points.get(name);
      return xs.map((s) => {
        const v = series.get(s);
        if (v === undefined) return null;
        count += 1;
        return v;
      });
    });
    charts[key].plot.setData([xs, ...ys]);
    node.dataset.points = String(count);
  }
}

window.addEventListener("resize", () => {
  for (const [key, c] of Object.entries(charts)) {
    const node = $(CHARTS[key].el);
    c.plot.setSize({ width: Math.max(node.clientWidth, 280), height: 220 });
  }
});
