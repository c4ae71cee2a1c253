// Pure reading of a job's history from its JSON: which job it retries, the step it resumed from, and its
// status transitions with the job that preempted it. No DOM, so node's test runner checks it directly.

const JOB_ID = /[A-Za-z0-9_-]+/;
const PREEMPTED_BY = new RegExp(`^preempted by job (${JOB_ID.source})`);

// The job that preempted this one, from a transition's reason ("preempted by job 01ab... (priority 80)"); else null.
export function preemptingJob(reason) {
  const m = PREEMPTED_BY.exec(reason || "");
  return m ? m[1] : null;
}

// The step the job's first resumed attempt started from: a retry resumes from the job it retries, a requeue
// (preemption, lost worker) from its own checkpoint. Null when every attempt started from scratch.
export function resumedFromStep(job) {
  const first = (job.attempts || []).find((a) => a.resumed_from_step !== null && a.resumed_from_step !== undefined);
  return first ? first.resumed_from_step : null;
}

// One line per attempt that resumed: {attempt, step}.
export function resumes(job) {
  return (job.attempts || [])
    .filter((a) => a.resumed_from_step !== null && a.resumed_from_step !== undefined)
    .map((a) => ({ attempt: a.attempt, step: a.resumed_from_step }));
}

// The timeline's rows, oldest first: {at, from, to, attempt, reason, preemptedBy}.
export function timeline(job) {
  return (job.transitions || []).map((t) => ({
    at: t.at, from: t.from_status, to: t.to_status, attempt: t.attempt, reason: t.reason || "", preemptedBy: preemptingJob(t.reason),
  }));
}

// A succeeded job's error block is from an attempt that failed before the one that finished: it is history, not
// the job's state, so the page shows it as such instead of as the job's error.
export const errorIsHistory = (job) => job.status === "succeeded" && Boolean(job.error);
