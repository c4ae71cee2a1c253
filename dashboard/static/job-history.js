// A job's history on its page: the job it retries and the step it resumed from, its error (or an earlier
// attempt's, once a later one succeeded), and its status transitions with the job that preempted it.
import { $, el, jobLink } from "./dom.js";
import { ago } from "./format.js";
import { errorIsHistory, preemptingJob, resumes, timeline } from "./lineage.js";

export function renderLineage(job) {
  const parts = [];
  if (job.retry_of) parts.push("retry of job ", jobLink(job.retry_of));
  const resumed = resumes(job);
  if (resumed.length) {
    if (parts.length) parts.push("; ");
    const steps = resumed.map((r) => (resumed.length > 1 ? `step ${r.step} (attempt ${r.attempt})` : `step ${r.step}`));
    parts.push(el("span", { dataset: { resumedFromStep: String(resumed[0].step) } }, `resumed from ${steps.join(", ")}`));
    if (job.retry_of) parts.push(" of that job's checkpoints");
  } else if (job.retry_of && job.attempts?.length) {
    parts.push("; started from scratch (that job left no checkpoint)");
  }
  const node = $("job-lineage");
  node.replaceChildren(...parts);
  node.hidden = parts.length === 0;
}

export function renderError(job) {
  const err = job.error;
  $("job-error").hidden = !err;
  if (!err) return;
  const history = errorIsHistory(job);
  $("job-error").classList.toggle("history", history);
  $("job-error-title").textContent = history ? "An earlier attempt failed (a later one succeeded)" : "Error";
  const exit = err.exit_code !== null && err.exit_code !== undefined ? ` (exit code ${err.exit_code})` : "";
  $("job-error-message").textContent = `${err.type || "error"}: ${err.message || ""}${exit}`;
  $("job-error-trace").textContent = err.traceback || err.log_tail || "";
}

// A reason as nodes: "preempted by job X ..." with X a link to that job, any other reason as text.
export function reasonNodes(reason) {
  const by = preemptingJob(reason);
  if (!by) return [reason || ""];
  return [el("span", { class: "preempted" }, "preempted by job "), jobLink(by), reason.slice(`preempted by job ${by}`.length)];
}

export function renderTimeline(job) {
  const rows = timeline(job).map((t) => {
    const reason = reasonNodes(t.reason);
    return el("li", { dataset: { to: t.to, ...(t.preemptedBy ? { preemptedBy: t.preemptedBy } : {}) } },
      el("span", { class: "when", title: t.at }, ago(t.at)),
      el("span", { class: "move" }, `${t.from} → ${t.to}`),
      el("span", { class: "attempt" }, `attempt ${t.attempt}`),
      el("span", { class: "reason" }, ...reason));
  });
  $("job-timeline").replaceChildren(...rows);
  $("timeline-card").hidden = rows.length === 0;
}
