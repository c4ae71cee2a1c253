// One job's page: its state, progress and ETA, charts fed by the event stream (or by polling /metrics on
// servers without it), lineage, timeline, checkpoints, logs, and the Cancel and Retry buttons.
import { api, quiet, routeMissing } from "./api.js";
import { addPoint, lastStep, latestValue, markFinished, scheduleRedraw } from "./charts.js";
import { $, el, sleep, toast } from "./dom.js";
import { streamEvents } from "./events.js";
import { ACTIVE, ago, fmtBytes, fmtDuration, fmtNum, progressPercent, ran, TERMINAL, throughput, totalSteps } from "./format.js";
import { fillRanks, loadCheckpoints, loadLogs } from "./job-files.js";
import { DISPLAY } from "./metric-names.js";
import { reasonNodes, renderError, renderLineage, renderTimeline } from "./job-history.js";
import { resumedFromStep } from "./lineage.js";
import { isCurrent, show } from "./view.js";

const JOB_POLL_MS = 3000;
const METRICS_POLL_MS = 1500;

let current = null; // {id, job, total, rate: [[time, step]], ended, logsMissing}

export async function openJob(id, gen, signal) {
  show("job-view");
  current = { id, job: null, total: null, rate: [], ended: false, logsMissing: false };
  $("job-name").textContent = id;
  $("job-status").replaceChildren();
  $("job-lineage").hidden = true;
  $("timeline-card").hidden = true;
  $("logs").textContent = "";
  try {
    const job = await loadJob(signal);
    await loadMetrics(signal);
    if (TERMINAL.has(job.status)) markFinished(); // every point it will ever have is loaded
    loadCheckpoints(current, signal);
    loadLogs(current, signal);
  } catch (err) {
    if (quiet(err)) return;
    toast(err.status === 404 ? `Job ${id} not found.` : `Could not load job: ${err.detail}`, "error");
    return;
  }
  const mine = current;
  const stop = () => !isCurrent(gen) || mine.ended;
  pollJob(gen, signal);
  const how = await streamEvents(id, { signal, stop, onEvent: (type, payload) => handleEvent(type, payload, signal) });
  if (how === "unsupported") pollEvents(gen, signal);
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
  const meta = [job.id, `attempt ${job.attempt}${job.max_attempts ? ` of at most ${job.max_attempts}` : ""}`, `created ${ago(job.created_at)}`];
  if (Number.isInteger(job.priority)) meta.push(`priority ${job.priority}`);
  if (job.worker_id) meta.push(`worker ${job.worker_id}`);
  if (job.queue_position !== null && job.queue_position !== undefined) meta.push(`queue position ${job.queue_position}`);
  // Why a queued job waits; a job preempted back into the queue links the job that took its place.
  const waiting = job.status === "queued" && job.waiting_reason ? [" · ", el("span", { class: "waiting" }, ...reasonNodes(job.waiting_reason))] : [];
  $("job-meta").replaceChildren(meta.join(" · "), ...waiting);
  $("cancel-btn").disabled = !["queued", "running"].includes(job.status);
  $("retry-btn").disabled = !TERMINAL.has(job.status);
  $("job-spec").textContent = JSON.stringify(job.spec, null, 2);
  fillRanks(job);
  renderLineage(job);
  renderError(job);
  renderTimeline(job);
  renderProgress();
}

function renderProgress() {
  const job = current.job;
  if (!job) return;
  // A resumed job starts at the step it resumed from, before it logs a point of its own.
  const step = Math.max(job.last_step ?? 0, lastStep() ?? 0, resumedFromStep(job) ?? 0);
  const total = current.total;
  $("job-progress-bar").style.width = `${progressPercent(job.status, step, total)}%`;
  $("job-progress-bar").className = `bar ${job.status}`;
  let eta = null;
  const r = current.rate;
  if (total && r.length >= 2 && ACTIVE.has(job.status)) {
    const [t0, s0] = r[0], [t1, s1] = r[r.length - 1];
    if (t1 > t0 && s1 > s0) eta = (total - step) / ((s1 - s0) / (t1 - t0));
  }
  const value = (name) => latestValue(name) ?? job.latest_metrics?.[name];
  // The logged name that fills a column (Lightning's train_loss for Loss): a display mapping, metric-names.js.
  const shownValue = (column) => (DISPLAY[column] ?? [column]).map(value).find((v) => v !== undefined && v !== null);
  const stats = [
    ["Step", total ? `${step} / ${total}` : String(step)],
    ["Loss", fmtNum(shownValue("train/loss"))],
    ["Eval loss", fmtNum(shownValue("eval/loss"))],
    ["Eval accuracy", fmtNum(value("eval/accuracy"))],
    ["Throughput", throughput({ "train/samples_per_s": value("train/samples_per_s"), "train/tokens_per_s": value("train/tokens_per_s") })],
    ["Memory (RSS)", fmtBytes(value("sys/rss_bytes"))],
    ["GPU memory", value("sys/gpu_mem_total") ? `${fmtBytes(value("sys/gpu_mem_used"))} / ${fmtBytes(value("sys/gpu_mem_total"))}` : "–"],
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
  const since = lastStep() ?? 0;
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

async function pollJob(gen, signal) {
  // The job row (status, attempt, error) and logs refresh on a slow timer; metrics come from the stream.
  const mine = current;
  while (isCurrent(gen)) {
    await sleep(JOB_POLL_MS, signal);
    if (!isCurrent(gen)) return;
    try {
      const job = await loadJob(signal);
      if (ACTIVE.has(job.status) && !mine.logsMissing) loadLogs(mine, signal);
      if (TERMINAL.has(job.status) && mine.ended) return;
      if (TERMINAL.has(job.status) && !mine.streaming) {
        // Finished while no stream watched it (or opened finished): the last points, then the panels' final word.
        await pollMetricsSince(signal);
        mine.ended = true;
        markFinished();
        return;
      }
    } catch (err) {
      if (quiet(err)) return;
    }
  }
}

async function onStatusChange(signal) {
  await loadJob(signal).catch(() => {});
  loadCheckpoints(current, signal);
  loadLogs(current, signal);
}

function handleEvent(type, payload, signal) {
  current.streaming = true;
  if (type === "metric") onMetric(payload);
  else if (type === "checkpoint") loadCheckpoints(current, signal);
  else if (type === "status") {
    if (current.job && payload.status) {
      current.job.status = payload.status;
      renderJob();
    }
    if (payload.total_steps) current.total = payload.total_steps;
    onStatusChange(signal);
  } else if (type === "end") {
    current.ended = true;
    markFinished();
    onStatusChange(signal);
  }
}

async function pollEvents(gen, signal) {
  // Fallback for servers without /events: the same updates, polled.
  let lastCheckpoints = -1;
  current.streaming = true;
  while (isCurrent(gen) && !current.ended) {
    try {
      await pollMetricsSince(signal);
      const job = current.job;
      if (job && TERMINAL.has(job.status)) {
        await pollMetricsSince(signal);
        current.ended = true;
        markFinished();
        onStatusChange(signal);
        return;
      }
      if (job && job.last_step !== lastCheckpoints) {
        lastCheckpoints = job.last_step;
        loadCheckpoints(current, signal);
      }
    } catch (err) {
      if (quiet(err)) return;
    }
    await sleep(METRICS_POLL_MS, signal);
  }
}

// The buttons act on whichever job the page shows; `reopen` re-renders the route after a retry of the same id.
export function wireJobButtons(reopen) {
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
      if (location.hash === `#/jobs/${again.id}`) reopen(); // same job id: reopen to start a fresh stream
      else location.hash = `#/jobs/${again.id}`;
    } catch (err) {
      toast(routeMissing(err) ? "This API does not support retry yet." : `Retry failed: ${err.detail}`, "error");
      renderJob();
    }
  });

  $("log-rank").addEventListener("change", () => current && loadLogs(current));
  $("log-refresh").addEventListener("click", () => current && loadLogs(current));
}
