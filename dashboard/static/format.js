// Pure formatting of the API's numbers, times and specs for the page. No DOM here, so node's test runner
// checks these functions directly (tests/dashboard/test_modules.py).

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const ACTIVE = new Set(["queued", "running", "cancelling"]);
// Mirrors jobspec/catalog.py defaults; only used to estimate total steps for progress bars.
const DEFAULT_SAMPLES = { "synthetic-classification": 8192, "synthetic-regression": 8192, "synthetic-lm": 4096 };
export const MISSING = "–";

export function totalSteps(spec) {
  const train = (spec && spec.train) || {};
  const data = (spec && spec.data) || {};
  const samples = (data.args && data.args.samples) ?? DEFAULT_SAMPLES[data.name];
  const batch = train.global_batch_size ?? 64;
  let total = null;
  if (Number.isInteger(samples) && batch > 0) total = (train.epochs ?? 1) * Math.floor(samples / batch);
  if (Number.isInteger(train.max_steps)) total = total ? Math.min(total, train.max_steps) : train.max_steps;
  return total || null;
}

// How full a job's bar is, 0-100. A succeeded job is done whatever its step count says: a script job has no
// known total, and a catalog job may stop short of the estimate (early stop, a dataset smaller than assumed).
export function progressPercent(status, step, total) {
  if (status === "succeeded") return 100;
  if (!total || step === null || step === undefined) return 0;
  return Math.min(100, (100 * step) / total);
}

export function fmtNum(v) {
  if (v === undefined || v === null || Number.isNaN(v)) return MISSING;
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  return a < 10 ? v.toFixed(4) : v.toLocaleString(undefined, { maximumFractionDigits: 1 });
}

export function fmtBytes(v) {
  if (v === undefined || v === null || !Number.isFinite(v)) return MISSING;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return MISSING;
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  return m ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
}

export const parseTime = (t) => (t ? new Date(t).getTime() : null);
export const ago = (t, now = Date.now()) => (t ? `${fmtDuration((now - parseTime(t)) / 1000)} ago` : MISSING);

export function ran(job, now = Date.now()) {
  if (!job.started_at) return MISSING;
  const end = job.finished_at ? parseTime(job.finished_at) : now;
  return fmtDuration((end - parseTime(job.started_at)) / 1000);
}

export function throughput(values) {
  if (!values) return MISSING;
  if (values["train/samples_per_s"] !== undefined && values["train/samples_per_s"] !== null) {
    return `${fmtNum(values["train/samples_per_s"])} samples/s`;
  }
  if (values["train/tokens_per_s"] !== undefined && values["train/tokens_per_s"] !== null) {
    return `${fmtNum(values["train/tokens_per_s"])} tok/s`;
  }
  return MISSING;
}

// The job list's priority cell: servers before priorities existed send none.
export const fmtPriority = (job) => (Number.isInteger(job.priority) ? String(job.priority) : MISSING);

// A GPU cell of the hosts view: the job that holds it when the caller may see it, "busy" for another owner's
// job (the API leaves its id out), or free.
export function gpuState(gpu) {
  if (gpu.job_id) return { state: "held", text: gpu.job_id, jobId: gpu.job_id };
  if (gpu.busy) return { state: "busy", text: "busy (another owner)", jobId: null };
  if (gpu.state === "quarantined") return { state: "quarantined", text: `quarantined: ${gpu.reason ?? ""}`, jobId: null };
  return { state: "free", text: "free", jobId: null };
}
