// Sweep pages of the dashboard: #/sweeps lists sweeps; #/sweeps/<id> shows one: its trials table, the sweep's
// metric against steps for every trial (stopped trials greyed), a scatter of one parameter against the metric,
// and "compare" of the top trials (the jobs' compare view).
// Server data goes on the page as text (textContent), never parsed as markup.

import { api } from "./api.js";
import { $, el, sleep } from "./dom.js";
import { isCurrent } from "./view.js";

const POLL_MS = 3000;
const LIVE = new Set(["pending", "running", "paused"]);
const GREY = "#c0c4cc";
const COLORS = ["#2563eb", "#f97316", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"];

let plots = [];

const fmt = (v) => (v === null || v === undefined ? "–" : Math.abs(v) < 1e-3 && v !== 0 ? v.toExponential(2) : Number(v).toPrecision(4));
const fmtParams = (p) => Object.entries(p).map(([k, v]) => `${k}=${typeof v === "number" ? fmt(v) : v}`).join(" ");

function destroy() {
  for (const p of plots) p.destroy();
  plots = [];
}

async function openList(gen, signal) {
  $("sweeps-list").hidden = false;
  $("sweep-detail").hidden = true;
  document.title = "Sweeps · torchyard";
  while (isCurrent(gen)) {
    try {
      const { items } = await api("/v1/sweeps?limit=100", { signal });
      $("sweeps-empty").hidden = items.length > 0;
      $("sweeps-table").querySelector("tbody").replaceChildren(...items.map((s) => el("tr", { dataset: { sweepId: s.id } },
        el("td", {}, el("a", { href: `#/sweeps/${s.id}` }, s.name)), el("td", { class: "mono" }, s.id),
        el("td", {}, s.method), el("td", {}, el("span", { class: `badge ${s.status}` }, s.status)),
        el("td", { class: "num" }, String(s.max_trials)),
        el("td", { class: "num" }, s.best_trial === null ? "" : `#${s.best_trial} ${fmt(s.best_value)}`))));
    } catch (err) {
      if (err.name === "AbortError") return;
    }
    await sleep(POLL_MS, signal);
  }
}

async function curves(sweep, signal) {
  const out = new Map();
  await Promise.all(sweep.trials.filter((t) => t.job_id).map(async (t) => {
    const q = new URLSearchParams({ name: sweep.metric, limit: "10000" });
    const { items } = await api(`/v1/jobs/${t.job_id}/metrics?${q}`, { signal });
    out.set(t.number, items.map((m) => [m.step, m.value]));
  }));
  return out;
}

function drawCurves(sweep, series) {
  const node = $("sweep-curves");
  const trials = sweep.trials.filter((t) => (series.get(t.number) || []).length);
  node.dataset.series = String(trials.length);
  node.dataset.greyed = String(trials.filter((t) => t.state === "stopped").length);
  if (!trials.length || typeof uPlot === "undefined") {
    node.replaceChildren(el("div", { class: "chart-empty" }, `no ${sweep.metric} yet`));
    return;
  }
  const steps = [...new Set(trials.flatMap((t) => series.get(t.number).map(([s]) => s)))].sort((a, b) => a - b);
  const ys = trials.map((t) => {
    const at = new Map(series.get(t.number));
    return steps.map((s) => (at.has(s) ? at.get(s) : null));
  });
  node.replaceChildren();
  plots.push(new uPlot({
    width: Math.max(node.clientWidth, 280), height: 260, scales: { x: { time: false } }, legend: { show: false },
    axes: [{ label: "step" }, { label: sweep.metric, size: 60 }],
    series: [{}, ...trials.map((t, i) => ({
      label: `trial ${t.number}`, spanGaps: true, points: { show: true, size: 4 },
      stroke: t.state === "stopped" || t.state === "cancelled" ? GREY : COLORS[i % COLORS.length],
      width: t.number === sweep.best_trial ? 3 : 1.5,
    }))],
  }, [steps, ...ys], node));
}

function drawScatter(sweep) {
  const node = $("sweep-scatter");
  const select = $("sweep-param");
  const names = Object.keys(sweep.trials[0]?.params || {});
  if (select.options.length !== names.length) select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  const param = select.value || names[0];
  const scored = sweep.trials.filter((t) => t.last_value !== null && typeof t.params[param] === "number")
    .sort((a, b) => a.params[param] - b.params[param]);
  node.dataset.points = String(scored.length);
  if (!scored.length || typeof uPlot === "undefined") {
    node.replaceChildren(el("div", { class: "chart-empty" }, "no trial has reported yet"));
    return;
  }
  const xs = scored.map((t) => t.params[param]);
  const log = xs.every((x) => x > 0) && Math.max(...xs) / Math.min(...xs) > 50;
  node.replaceChildren();
  plots.push(new uPlot({
    width: Math.max(node.clientWidth, 280), height: 260, legend: { show: false },
    scales: { x: { time: false, distr: log ? 3 : 1 } }, axes: [{ label: param }, { label: sweep.metric, size: 60 }],
    series: [{}, { stroke: COLORS[0], width: 0, points: { show: true, size: 8, fill: COLORS[0] }, paths: () => null }],
  }, [xs, scored.map((t) => t.last_value)], node));
}

function renderTrials(sweep) {
  $("sweep-name").textContent = sweep.name;
  const status = $("sweep-status");
  status.textContent = sweep.status;
  status.className = `badge ${sweep.status}`;
  const counts = Object.entries(sweep.counts || {}).map(([k, v]) => `${v} ${k}`).join(", ");
  $("sweep-meta").textContent = `${sweep.method} · ${sweep.metric} (${sweep.mode}) · ${sweep.max_trials} trials, `
    + `${sweep.max_concurrent_trials} at a time · ${counts}`;
  $("sweep-best").textContent = sweep.best_trial === null ? "no trial has reported yet"
    : `best: trial ${sweep.best_trial}, ${sweep.metric} ${fmt(sweep.best_value)}: ${fmtParams(sweep.best_params || {})}`;
  $("sweep-trials").querySelector("tbody").replaceChildren(...sweep.trials.map((t) => el("tr", {
    class: t.state === "stopped" ? "greyed" : "", dataset: { trial: String(t.number), state: t.state } },
  el("td", { class: "num" }, `${t.number}${t.number === sweep.best_trial ? " ★" : ""}`),
  el("td", {}, t.state), el("td", { class: "num" }, t.rung === null ? "" : String(t.rung)),
  el("td", { class: "num" }, t.last_step === null ? "" : String(t.last_step)),
  el("td", { class: "num" }, fmt(t.last_value)), el("td", { class: "num" }, fmt(t.best_value)),
  el("td", {}, t.job_id ? el("a", { href: `#/jobs/${t.job_id}`, class: "mono" }, t.job_id) : ""),
  el("td", {}, fmtParams(t.params)))));
  const better = (a, b) => (sweep.mode === "min" ? a - b : b - a);
  const top = sweep.trials.filter((t) => t.job_id && t.last_value !== null)
    .sort((a, b) => (b.rung ?? -1) - (a.rung ?? -1) || better(a.last_value, b.last_value)).slice(0, 4);
  const compare = $("sweep-compare");
  compare.hidden = top.length < 2;
  compare.href = `#/compare/${top.map((t) => t.job_id).join(",")}`;
}

async function openDetail(id, gen, signal) {
  $("sweeps-list").hidden = true;
  $("sweep-detail").hidden = false;
  $("sweep-param").onchange = () => { if (last) { destroy(); drawCurves(last, lastSeries); drawScatter(last); } };
  let last = null;
  let lastSeries = new Map();
  while (isCurrent(gen)) {
    try {
      const sweep = await api(`/v1/sweeps/${id}`, { signal });
      document.title = `${sweep.name} · sweeps · torchyard`;
      const series = await curves(sweep, signal);
      if (!isCurrent(gen)) return;
      renderTrials(sweep);
      destroy();
      drawCurves(sweep, series);
      drawScatter(sweep);
      last = sweep;
      lastSeries = series;
      if (!sweep.trials.some((t) => LIVE.has(t.state)) && sweep.status !== "running") return;
    } catch (err) {
      if (err.name === "AbortError") return;
      $("sweep-meta").textContent = err.status === 404 ? "This sweep was not found." : `Could not load the sweep: ${err.detail}`;
      return;
    }
    await sleep(POLL_MS, signal);
  }
}

// The router (app.js) opens #/sweeps and #/sweeps/<id> here.
export function openSweeps(hash, gen, signal) {
  destroy();
  const m = hash.match(/^#\/sweeps\/([A-Za-z0-9_-]+)/);
  return m ? openDetail(m[1], gen, signal) : openList(gen, signal);
}

export const destroySweeps = destroy;
