// torchyard dashboard: plain JavaScript, no build step. It calls the JSON API with the user's Bearer
// key; live job data comes from the SSE stream GET /v1/jobs/{id}/events read with fetch() (EventSource
// cannot send an Authorization header), and from polling /metrics on servers without that stream.
// Every piece of server data is put on the page as text (textContent), never parsed as markup.

const KEY_STORAGE = "torchyard.apiKey";
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const ACTIVE = new Set(["queued", "running", "cancelling"]);
// Mirrors trainer/catalog.py defaults; only used to estimate total steps for progress bars.
const DEFAULT_SAMPLES = { "synthetic-classification": 8192, "synthetic-regression": 8192, "synthetic-lm": 4096 };
const JOBS_POLL_MS = 2000;
const JOB_POLL_MS = 3000;
const METRICS_POLL_MS = 1500;

const $ = (id) => document.getElementById(id);

let apiKey = sessionStorage.getItem(KEY_STORAGE);
// Each view render bumps the generation; loops and streams of an older generation stop themselves.
let generation = 0;
let viewAbort = null;

// ------------------------------------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

async function api(path, { method = "GET", headers = {}, body, signal, raw = false } = {}) {
  const init = { method, signal, headers: { Authorization: `Bearer ${apiKey}`, Accept: "application/json", ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    setConnection(false);
    throw new ApiError(0, "the API does not answer");
  }
  setConnection(true);
  if (res.status === 401) {
    signOut("The API refused this key.");
    throw new ApiError(401, "unauthorized");
  }
  if (!res.ok) {
    let detail = res.statusText;
    try {
      detail = (await res.json()).detail || detail;
    } catch {
      // not problem+json (a proxy page); keep the status text
    }
    throw new ApiError(res.status, detail);
  }
  return raw ? res : res.json();
}

// A 404 whose detail is the framework's bare "Not Found" means the route itself is missing (an API
// version without that endpoint); a missing job says "job ... not found".
const routeMissing = (err) => err instanceof ApiError && err.status === 404 && /^not found$/i.test(err.detail || "");

// ------------------------------------------------------------------------------------------- helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function totalSteps(spec) {
  const train = (spec && spec.train) || {};
  const data = (spec && spec.data) || {};
  const samples = (data.args && data.args.samples) ?? DEFAULT_SAMPLES[data.name];
  const batch = train.global_batch_size ?? 64;
  let total = null;
  if (Number.isInteger(samples) && batch > 0) total = (train.epochs ?? 1) * Math.floor(samples / batch);
  if (Number.isInteger(train.max_steps)) total = total ? Math.min(total, train.max_steps) : train.max_steps;
  return total || null;
}

function fmtNum(v) {
  if (v === undefined || v === null || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return a < 10 ? v.toFixed(4) : v.toLocaleString(undefined, { maximumFractionDigits: 1 });
}

function fmtBytes(v) {
  if (v === undefined || v === null || !Number.isFinite(v)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  return m ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}

const parseTime = (t) => (t ? new Date(t).getTime() : null);
const ago = (t) => (t ? `${fmtDuration((Date.now() - parseTime(t)) / 1000)} ago` : "–");

function ran(job) {
  if (!job.started_at) return "–";
  const end = job.finished_at ? parseTime(job.finished_at) : Date.now();
  return fmtDuration((end - parseTime(job.started_at)) / 1000);
}

function throughput(values) {
  if (!values) return "–";
  if (values["train/samples_per_s"] !== undefined) return `${fmtNum(values["train/samples_per_s"])} samples/s`;
  if (values["train/tokens_per_s"] !== undefined) return `${fmtNum(values["train/tokens_per_s"])} tok/s`;
  return "–";
}

function badge(status) {
  return el("span", { class: `badge ${status}`, "data-status": status }, status);
}

function progressBar(step, total) {
  const pct = total && step !== null && step !== undefined ? Math.min(100, (100 * step) / total) : 0;
  const bar = el("div", { class: "bar" });
  bar.style.width = `${pct}%`;
  const label = step === null || step === undefined ? "–" : total ? `${step}/${total}` : String(step);
  return el("div", { class: "mini" }, el("div", { class: "progress" }, bar), el("span", {}, label));
}

let toastTimer = null;
function toast(message, kind = "info") {
  const t = $("toast");
  t.textContent = message;
  t.className = `toast ${kind}`;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (t.hidden = true), 5000);
}

function setConnection(ok) {
  const c = $("conn");
  c.textContent = ok ? "connected" : "API unreachable";
  c.className = ok ? "conn ok" : "conn bad";
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });

// ------------------------------------------------------------------------------------------- routing

function show(view) {
  for (const id of ["login-view", "jobs-view", "job-view", "compare-view", "sweeps-view"]) $(id).hidden = id !== view;
  $("signout").hidden = view === "login-view";
}

function signOut(message) {
  apiKey = null;
  sessionStorage.removeItem(KEY_STORAGE);
  route();
  if (message) {
    const e = $("login-error");
    e.textContent = message;
    e.hidden = false;
  }
}

function route() {
  generation += 1;
  viewAbort?.abort();
  viewAbort = new AbortController();
  destroyCharts();
  if (!apiKey) {
    show("login-view");
    $("key-input").focus();
    return;
  }
  const m = location.hash.match(/^#\/jobs\/([A-Za-z0-9_-]+)/);
  const c = location.hash.match(/^#\/compare\/([A-Za-z0-9_,-]+)/);
  if (location.hash.startsWith("#/sweeps") && window.torchyardSweeps) { // sweep.js
    show("sweeps-view");
    window.torchyardSweeps.open(location.hash, generation, viewAbort.signal, () => generation);
  } else if (m) openJob(m[1], generation, viewAbort.signal);
  else if (c) openCompare(c[1].split(",").filter(Boolean), generation, viewAbort.signal);
  else openJobs(generation, viewAbort.signal);
}

// ------------------------------------------------------------------------------------------- jobs list

async function openJobs(gen, signal) {
  show("jobs-view");
  document.title = "Jobs · torchyard";
  while (gen === generation) {
    try {
      await refreshJobs(signal);
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      if (err.status) toast(`Could not list jobs: ${err.detail}`, "error");
    }
    await sleep(JOBS_POLL_MS, signal);
  }
}

async function refreshJobs(signal) {
  const status = $("status-filter").value;
  const query = new URLSearchParams({ limit: "100" });
  if (status) query.append("status", status);
  const page = await api(`/v1/jobs?${query}`, { signal });
  const rows = page.items.map((job) => {
    const open = () => (location.hash = `#/jobs/${job.id}`);
    return el(
      "tr",
      { dataset: { jobId: job.id, status: job.status }, tabindex: "0", onclick: open, onkeydown: (e) => e.key === "Enter" && open() },
      el("td", { class: "pick", onclick: (e) => e.stopPropagation() }, pickBox(job.id)),
      el("td", { class: "name" }, el("a", { href: `#/jobs/${job.id}` }, job.name)),
      el("td", { class: "mono" }, job.id),
      el("td", {}, badge(job.status)),
      el("td", {}, progressBar(job.last_step, totalSteps(job.spec))),
      el("td", { class: "num" }, fmtNum(job.latest_metrics?.["train/loss"])),
      el("td", { class: "num" }, throughput(job.latest_metrics)),
      el("td", { class: "num" }, job.max_attempts ? `${job.attempt}/${job.max_attempts}` : String(job.attempt)),
      el("td", { title: job.created_at }, ago(job.created_at)),
      el("td", { class: "num" }, ran(job)),
    );
  });
  $("jobs-table").tBodies[0].replaceChildren(...rows);
  $("jobs-empty").hidden = rows.length > 0;
}

// Jobs ticked for comparison; kept across the table's refreshes.
const picked = new Set();

function pickBox(id) {
  const box = el("input", { type: "checkbox", "aria-label": `compare job ${id}`, dataset: { pick: id } });
  box.checked = picked.has(id);
  box.addEventListener("change", () => {
    if (box.checked) picked.add(id);
    else picked.delete(id);
    updateCompareButton();
  });
  return box;
}

function updateCompareButton() {
  const btn = $("compare-btn");
  btn.disabled = picked.size < 2;
  btn.textContent = picked.size ? `Compare (${picked.size})` : "Compare";
}

$("compare-btn").addEventListener("click", () => {
  if (picked.size >= 2) location.hash = `#/compare/${[...picked].join(",")}`;
});

// ------------------------------------------------------------------------------------------- charts

const COLORS = ["#2563eb", "#f97316", "#16a34a", "#9333ea"];
// A metric keeps its colour whichever other series are present (the test looks for train/loss's blue).
const CHART_COLOR = { "train/loss": 0, "eval/loss": 1, "eval/accuracy": 2, "train/samples_per_s": 3, "train/tokens_per_s": 3,
  "sys/cpu_percent": 0, "sys/gpu_util": 1 };
const CHARTS = {
  loss: { el: "chart-loss", series: [["train/loss", "train"], ["eval/loss", "eval"]] },
  eval: { el: "chart-eval", series: [["eval/accuracy", "accuracy"]] },
  throughput: { el: "chart-throughput", series: [["train/samples_per_s", "samples/s"], ["train/tokens_per_s", "tokens/s"]] },
  system: { el: "chart-system", series: [["sys/cpu_percent", "cpu %"], ["sys/gpu_util", "gpu %"]] },
};
let charts = {}; // key -> {plot, sig}: a chart is built for the series that have data, rebuilt when one appears
let points = new Map(); // metric name -> Map(step -> value)
let redrawPending = false;

function destroyCharts() {
  for (const c of Object.values(charts)) c.plot.destroy();
  charts = {};
  for (const p of compareCharts) p.destroy();
  compareCharts = [];
  points = new Map();
  for (const def of Object.values(CHARTS)) {
    const node = $(def.el);
    node.replaceChildren(el("div", { class: "chart-empty" }, "waiting for metrics…"));
    node.dataset.points = "0";
  }
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

function addPoint(name, step, value) {
  let series = points.get(name);
  if (!series) points.set(name, (series = new Map()));
  series.set(step, value);
}

function scheduleRedraw() {
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

// ------------------------------------------------------------------------------------------- one job

let current = null; // {id, job, total, rate: [[time, step]], ended}

async function openJob(id, gen, signal) {
  show("job-view");
  current = { id, job: null, total: null, rate: [], ended: false, logsMissing: false };
  $("job-name").textContent = id;
  $("job-status").replaceChildren();
  $("logs").textContent = "";
  try {
    await loadJob(signal);
    await loadMetrics(signal);
    loadCheckpoints(signal);
    loadLogs(signal);
  } catch (err) {
    if (err.name === "AbortError" || err.status === 401) return;
    toast(err.status === 404 ? `Job ${id} not found.` : `Could not load job: ${err.detail}`, "error");
    return;
  }
  streamEvents(id, gen, signal);
  pollJob(id, gen, signal);
}

async function loadJob(signal) {
  const job = await api(`/v1/jobs/${current.id}`, { signal });
  current.job = job;
  current.total = current.total || totalSteps(job.spec);
  renderJob();
  return job;
}

function renderJob() {
  const job = current.job;
  document.title = `${job.name} · torchyard`;
  $("job-name").textContent = job.name;
  const b = $("job-status");
  b.textContent = job.status;
  b.className = `badge ${job.status}`;
  b.dataset.status = job.status;
  const meta = [job.id, `attempt ${job.attempt}${job.max_attempts ? `/${job.max_attempts}` : ""}`, `created ${ago(job.created_at)}`];
  if (job.worker_id) meta.push(`worker ${job.worker_id}`);
  if (job.queue_position !== null && job.queue_position !== undefined) meta.push(`queue position ${job.queue_position}`);
  $("job-meta").textContent = meta.join(" · ");
  $("cancel-btn").disabled = !["queued", "running"].includes(job.status);
  $("retry-btn").disabled = !TERMINAL.has(job.status);
  $("job-spec").textContent = JSON.stringify(job.spec, null, 2);

  const world = (job.spec.parallel?.nproc_per_node ?? 1) * (job.spec.parallel?.nnodes ?? 1);
  const rankSel = $("log-rank");
  if (rankSel.options.length !== world + 2) {
    const ranks = Array.from({ length: world }, (_, r) => el("option", { value: String(r) }, `rank ${r}`));
    rankSel.replaceChildren(el("option", { value: "all" }, "all ranks"), ...ranks, el("option", { value: "launcher" }, "launcher"));
    rankSel.value = "all"; // every rank's output as printed, each line prefixed [rank N]
  }

  const err = job.error;
  $("job-error").hidden = !err;
  if (err) {
    $("job-error-message").textContent = `${err.type || "error"}: ${err.message || ""}${err.exit_code !== null && err.exit_code !== undefined ? ` (exit code ${err.exit_code})` : ""}`;
    $("job-error-trace").textContent = err.traceback || err.log_tail || "";
  }
  renderProgress();
}

function latestValue(name) {
  const series = points.get(name);
  if (!series || !series.size) return current.job?.latest_metrics?.[name];
  return series.get(Math.max(...series.keys()));
}

function renderProgress() {
  const job = current.job;
  if (!job) return;
  let step = job.last_step ?? 0;
  for (const series of points.values()) for (const s of series.keys()) step = Math.max(step, s);
  const total = current.total;
  const pct = total ? Math.min(100, (100 * step) / total) : job.status === "succeeded" ? 100 : 0;
  $("job-progress-bar").style.width = `${pct}%`;
  $("job-progress-bar").className = `bar ${job.status}`;
  let eta = null;
  const r = current.rate;
  if (total && r.length >= 2 && ACTIVE.has(job.status)) {
    const [t0, s0] = r[0], [t1, s1] = r[r.length - 1];
    if (t1 > t0 && s1 > s0) eta = (total - step) / ((s1 - s0) / (t1 - t0));
  }
  const stats = [
    ["Step", total ? `${step} / ${total}` : String(step)],
    ["Loss", fmtNum(latestValue("train/loss"))],
    ["Eval loss", fmtNum(latestValue("eval/loss"))],
    ["Eval accuracy", fmtNum(latestValue("eval/accuracy"))],
    ["Throughput", throughput({ "train/samples_per_s": latestValue("train/samples_per_s"), "train/tokens_per_s": latestValue("train/tokens_per_s") })],
    ["Memory (RSS)", fmtBytes(latestValue("sys/rss_bytes"))],
    ["GPU memory", latestValue("sys/gpu_mem_total") ? `${fmtBytes(latestValue("sys/gpu_mem_used"))} / ${fmtBytes(latestValue("sys/gpu_mem_total"))}` : "–"],
    ["ETA", ACTIVE.has(job.status) ? fmtDuration(eta) : "–"],
    ["Ran", ran(job)],
  ];
  $("job-stats").replaceChildren(...stats.flatMap(([k, v]) => [el("div", {}, el("dt", {}, k), el("dd", {}, v))]));
}

function onMetric(m) {
  for (const [name, value] of Object.entries(m.values || {})) addPoint(name, m.step, value);
  if (m.time) {
    // ETA from the trainer's own timestamps over the last 30 s: batches of events polled at once were made apart.
    current.rate.push([m.time, m.step]);
    while (current.rate.length > 2 && m.time - current.rate[0][0] > 30) current.rate.shift();
    if (current.rate.length > 1 && m.step < current.rate[current.rate.length - 2][1]) current.rate = [[m.time, m.step]];
  }
  scheduleRedraw();
  renderProgress();
}

async function loadMetrics(signal) {
  let cursor = null;
  do {
    const q = new URLSearchParams({ limit: "10000" });
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/jobs/${current.id}/metrics?${q}`, { signal });
    for (const p of page.items) addPoint(p.name, p.step, p.value);
    cursor = page.next_cursor;
  } while (cursor);
  scheduleRedraw();
  renderProgress();
}

async function pollMetricsSince(signal) {
  let since = 0;
  for (const series of points.values()) for (const s of series.keys()) since = Math.max(since, s);
  let cursor = null;
  const byStep = new Map();
  do {
    // since_step is inclusive: eval points of the last step may land after its train points.
    const q = new URLSearchParams({ limit: "10000", since_step: String(since) });
    if (cursor) q.set("cursor", cursor);
    const page = await api(`/v1/jobs/${current.id}/metrics?${q}`, { signal });
    for (const p of page.items) {
      const m = byStep.get(p.step) || { step: p.step, values: {}, time: p.time };
      m.values[p.name] = p.value;
      m.time = Math.max(m.time, p.time);
      byStep.set(p.step, m);
    }
    cursor = page.next_cursor;
  } while (cursor);
  for (const m of [...byStep.values()].sort((a, b) => a.step - b.step)) onMetric(m);
}

async function loadCheckpoints(signal) {
  try {
    const { items } = await api(`/v1/jobs/${current.id}/checkpoints`, { signal });
    // keep_last deletes old checkpoints' files: their rows stay, marked, so the step history reads right.
    const rows = items.map((c) =>
      el("tr", c.available === false ? { class: "pruned", title: "pruned by keep_last: its files are gone" } : {},
        el("td", { class: "num" }, String(c.step)), el("td", { class: "num" }, c.epoch ?? "–"),
        el("td", { class: "mono" }, c.available === false ? `${c.path} (pruned)` : c.path),
        el("td", { title: c.created_at }, ago(c.created_at))));
    $("checkpoints").tBodies[0].replaceChildren(...rows);
    $("checkpoints-empty").hidden = rows.length > 0;
  } catch (err) {
    if (err.name !== "AbortError" && err.status !== 401) toast(`Could not load checkpoints: ${err.detail}`, "error");
  }
}

async function loadLogs(signal) {
  const pre = $("logs");
  const rank = $("log-rank").value || "all";
  const query = new URLSearchParams({ tail: "300" });
  if (rank !== "all") query.set("rank", rank); // a rank number, or "launcher" for torchrun's own log
  try {
    const res = await api(`/v1/jobs/${current.id}/logs?${query}`, { signal, raw: true, headers: { Accept: "text/plain" } });
    const text = await res.text();
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    pre.textContent = text || "(empty)";
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  } catch (err) {
    if (err.name === "AbortError" || err.status === 401) return;
    if (err.status === 404) {
      // No log for that rank yet, or a server without the logs endpoint: show what the job row keeps.
      current.logsMissing = routeMissing(err);
      const tail = current.job?.error?.log_tail;
      pre.textContent = tail ? `${tail}\n\n(the failing rank's last lines)` : current.logsMissing ? "This API does not serve logs yet." : "No log yet.";
    } else {
      pre.textContent = `Could not load logs: ${err.detail}`;
    }
  }
}

async function pollJob(id, gen, signal) {
  // The job row (status, attempt, error) and logs refresh on a slow timer; metrics come from the stream.
  while (gen === generation) {
    await sleep(JOB_POLL_MS, signal);
    if (gen !== generation) return;
    try {
      const job = await loadJob(signal);
      if (ACTIVE.has(job.status) && !current.logsMissing) loadLogs(signal);
      if (TERMINAL.has(job.status) && current.ended) return;
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
    }
  }
}

async function onStatusChange(signal) {
  await loadJob(signal).catch(() => {});
  loadCheckpoints(signal);
  loadLogs(signal);
}

async function streamEvents(id, gen, signal) {
  let lastId = null;
  let failures = 0;
  while (gen === generation && !current.ended) {
    let resumeNow = false;
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const res = await api(`/v1/jobs/${id}/events`, { signal, headers, raw: true });
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let event = { type: "message", data: [], id: null };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        failures = 0;
        buffer += value;
        let nl;
        while ((nl = buffer.search(/\r?\n/)) >= 0) {
          const line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + (buffer[nl] === "\r" ? 2 : 1));
          if (line === "") {
            if (event.data.length) {
              if (event.id !== null) lastId = event.id;
              // "reconnect": the stream reached its lifetime on the server; the loop reopens it from lastId.
              if (event.type === "reconnect") resumeNow = true;
              else handleEvent(event.type, event.data.join("\n"), signal);
            }
            event = { type: "message", data: [], id: null };
            continue;
          }
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? "" : line.slice(colon + 1);
          if (val.startsWith(" ")) val = val.slice(1);
          if (field === "event") event.type = val;
          else if (field === "data") event.data.push(val);
          else if (field === "id") event.id = val;
        }
      }
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      if (err.status === 404 && routeMissing(err)) return pollEvents(id, gen, signal);
      if (err.status === 404) return; // the job is gone
    }
    if (current.ended || gen !== generation) return;
    if (resumeNow) continue;
    failures += 1;
    await sleep(Math.min(500 * failures, 5000), signal); // dropped: resume from lastId
  }
}

function handleEvent(type, data, signal) {
  let payload;
  try {
    payload = JSON.parse(data);
  } catch {
    return;
  }
  if (type === "metric") onMetric(payload);
  else if (type === "checkpoint") loadCheckpoints(signal);
  else if (type === "status") {
    if (current.job && payload.status) {
      current.job.status = payload.status;
      renderJob();
    }
    if (payload.total_steps) current.total = payload.total_steps;
    onStatusChange(signal);
  } else if (type === "end") {
    current.ended = true;
    onStatusChange(signal);
  }
}

async function pollEvents(id, gen, signal) {
  // Fallback for servers without /events: the same updates, polled.
  let lastCheckpoints = -1;
  while (gen === generation && !current.ended) {
    try {
      await pollMetricsSince(signal);
      const job = current.job;
      if (job && TERMINAL.has(job.status)) {
        await pollMetricsSince(signal);
        current.ended = true;
        onStatusChange(signal);
        return;
      }
      if (job && job.last_step !== lastCheckpoints) {
        lastCheckpoints = job.last_step;
        loadCheckpoints(signal);
      }
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
    }
    await sleep(METRICS_POLL_MS, signal);
  }
}

// ------------------------------------------------------------------------------------------- actions

// ------------------------------------------------------------------------------------------- compare runs

const COMPARE_COLORS = ["#2563eb", "#f97316", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"];
const COMPARE = {
  loss: { el: "compare-loss", metrics: ["train/loss"] },
  eval: { el: "compare-eval", metrics: ["eval/accuracy", "eval/loss"] }, // the first one the jobs have
  throughput: { el: "compare-throughput", metrics: ["train/samples_per_s", "train/tokens_per_s"] },
};
const COMPARE_METRICS = [...new Set(Object.values(COMPARE).flatMap((c) => c.metrics))];
let compareCharts = [];

// Every leaf of a spec as "a.b.c" -> JSON text, so nested fields compare one by one.
function flatSpec(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
    for (const [k, v] of Object.entries(value)) flatSpec(v, prefix ? `${prefix}.${k}` : k, out);
  } else if (prefix) {
    out[prefix] = JSON.stringify(value);
  }
  return out;
}

// The fields whose values are not the same in every job (name left out: the legend shows it anyway).
function differingFields(specs) {
  const flat = specs.map((s) => flatSpec(s));
  const keys = new Set(flat.flatMap((f) => Object.keys(f)));
  return [...keys].filter((k) => k !== "name" && new Set(flat.map((f) => f[k] ?? "unset")).size > 1).sort();
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

async function openCompare(ids, gen, signal) {
  show("compare-view");
  document.title = "Compare · torchyard";
  $("compare-legend").replaceChildren();
  let runs;
  try {
    runs = await Promise.all(ids.map(async (id) => ({ job: await api(`/v1/jobs/${id}`, { signal }), series: await jobMetrics(id, signal) })));
  } catch (err) {
    if (err.name === "AbortError" || err.status === 401) return;
    toast(err.status === 404 ? "One of these jobs was not found." : `Could not load jobs: ${err.detail}`, "error");
    return;
  }
  if (gen !== generation) return;
  const fields = differingFields(runs.map((r) => r.job.spec));
  $("compare-legend").replaceChildren(...runs.map((r, i) => {
    const flat = flatSpec(r.job.spec);
    const diff = fields.map((f) => `${f}=${flat[f] ?? "unset"}`).join(", ");
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = COMPARE_COLORS[i % COMPARE_COLORS.length];
    return el("li", { dataset: { jobId: r.job.id } }, swatch, el("a", { href: `#/jobs/${r.job.id}` }, r.job.name),
      el("span", { class: "mono" }, r.job.id), badge(r.job.status), el("span", { class: "diff" }, diff || "same spec"));
  }));
  for (const def of Object.values(COMPARE)) drawCompare(def, runs);
}

function drawCompare(def, runs) {
  const node = $(def.el);
  const metric = def.metrics.find((m) => runs.some((r) => r.series.get(m).size)) ?? def.metrics[0];
  const withData = runs.map((r, i) => ({ r, i })).filter(({ r }) => r.series.get(metric).size);
  node.dataset.series = String(withData.length);
  node.dataset.metric = metric;
  if (!withData.length || typeof uPlot === "undefined") {
    node.replaceChildren(el("div", { class: "chart-empty" }, `no ${metric} yet`));
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
      label: `${r.job.name} ${r.job.id.slice(-6)}`, stroke: COMPARE_COLORS[i % COMPARE_COLORS.length], width: 2, spanGaps: true,
      ...(metric.startsWith("eval/") ? { points: { show: true, size: 5 } } : {}), value: (u, v) => fmtNum(v),
    }))],
  }, [xs, ...ys], node);
  compareCharts.push(plot);
  node.dataset.points = String(count);
}

$("cancel-btn").addEventListener("click", async () => {
  const job = current?.job;
  if (!job || !confirm(`Cancel job ${job.name} (${job.id})? A running job saves a checkpoint and stops.`)) return;
  $("cancel-btn").disabled = true;
  try {
    current.job = await api(`/v1/jobs/${job.id}/cancel`, { method: "POST" });
    renderJob();
    toast(`Job ${job.name}: ${current.job.status}`);
  } catch (err) {
    toast(`Cancel failed: ${err.detail}`, "error");
    renderJob();
  }
});

$("retry-btn").addEventListener("click", async () => {
  const job = current?.job;
  if (!job) return;
  $("retry-btn").disabled = true;
  try {
    const again = await api(`/v1/jobs/${job.id}/retry`, { method: "POST" });
    toast(`Job ${again.name}: ${again.status} (attempt ${again.attempt})`);
    if (location.hash === `#/jobs/${again.id}`) route(); // same job id: reopen to start a fresh stream
    else location.hash = `#/jobs/${again.id}`;
  } catch (err) {
    toast(routeMissing(err) ? "This API does not support retry yet." : `Retry failed: ${err.detail}`, "error");
    renderJob();
  }
});

$("log-rank").addEventListener("change", () => loadLogs(viewAbort?.signal));
$("log-refresh").addEventListener("click", () => loadLogs(viewAbort?.signal));
$("status-filter").addEventListener("change", () => refreshJobs(viewAbort?.signal).catch(() => {}));

$("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  apiKey = key;
  $("login-error").hidden = true;
  try {
    await api("/v1/jobs?limit=1");
  } catch (err) {
    if (err.status !== 401) {
      apiKey = null;
      $("login-error").textContent = `Could not check the key: ${err.detail}`;
      $("login-error").hidden = false;
    }
    return;
  }
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  route();
});

$("signout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", route);
route();
