"""A verdict (worker/verdicts.py) written down: what it is judged on read from SQL, then the device-fault counts, the
attempt's row, its MLflow run and the job's move (jobs/store/states.py), every read and write through the attempt's lease
(worker/lease.py: fenced, and tried again through a blip while the lease lasts)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from jobs.hosts import gpu_faults
from jobs.store.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.store.states import TransitionRefused, cancelled_by, requeue, transition, worker_losses
from worker import mlflow_runs
from worker.lease import Lease
from worker.outcome import Failure
from worker.verdicts import Facts, Stop, Verdict, Why

log = logging.getLogger(__name__)


def facts(lease: Lease, job: Job, stop: Stop, *, last_phase: str | None, nnodes: int, ranks: int,
          pause_at: str | None) -> Facts:
    """What the verdict on the job's attempt depends on besides why it stopped (``stop``)."""
    if not stop.ours:  # nothing more is read or written for a job that is no longer this attempt's
        return Facts(attempt=job.attempt, max_attempts=job.max_attempts)
    session, settings = lease.session, lease.settings
    return Facts(
        attempt=job.attempt, max_attempts=job.max_attempts, last_phase=last_phase, nnodes=nnodes,
        earlier_losses=lease.db(lambda: worker_losses(session, job.id, job.attempt), "counting lost workers"),
        max_worker_losses=settings.max_worker_losses, placement=job.placement or [],
        faulted_before=lease.db(lambda: gpu_faults.faulted_before(session, job.id, job.attempt), "reading earlier faults"),
        fault_patterns=gpu_faults.patterns(settings.gpu_fault_patterns),
        spec=job.spec, ranks=ranks, adjustments=job.adjustments, pause_at=pause_at,
        cancelled_by=lease.db(lambda: cancelled_by(session, job.id), "reading who cancelled") if stop.why is Why.CANCEL else "user",
    )


def record(lease: Lease, job: Job, verdict: Verdict, *, events: Path, resumed_step: int | None,
           unreadable: str | None) -> str:
    """Write ``verdict`` down; returns what the attempt's task answers. ``unreadable``: what the attempt could not
    read for the job (event files), said with how it ended."""
    if verdict.status is None:  # the job is no longer this attempt's: nothing to write
        return verdict.reason
    session, settings, to, error = lease.session, lease.settings, verdict.status, verdict.error
    if verdict.fault is not None:
        fault = verdict.fault
        lease.db(lambda: gpu_faults.record_fault(session, fault.gpus, fault.line, settings.gpu_fault_limit),
                 "counting a device fault")
        where = ", ".join(f"{host} GPU {gpu}" for host, gpu in fault.gpus)
        log.warning("job %s: device fault on %s: %s", job.id, where, fault.line, extra=lease.log_extra)
    if error is not None:
        error_type, message = error.type.value, error.message
    elif to is Status.QUEUED:  # back in line for no fault of the job's: the reason says why
        error_type, message = ErrorType.PREEMPTED.value, verdict.reason
    else:
        error_type = message = None
    resumed = _resumed_from(events)
    _record_attempt(lease, job, verdict.outcome, verdict.exit_code, error_type, message,
                    resumed_step if resumed is None else resumed)
    mlflow_runs.settle(Path(job.run_dir or ""), verdict.outcome or "", settings.mlflow_tracking_uri)
    if to is Status.SUCCEEDED:  # a success on a GPU wipes its device faults
        gpus = gpu_faults.blamed(job.placement or [], None)
        lease.db(lambda: gpu_faults.record_success(session, gpus), "clearing device faults")
    reason = f"{verdict.reason}; {unreadable}" if unreadable else verdict.reason
    values: dict[str, Any] = {}
    if to is Status.QUEUED:
        values = {"exit_code": verdict.exit_code, **verdict.values}
    elif error is None and verdict.exit_code is not None:
        values = {"exit_code": verdict.exit_code}
    if error is not None:
        values.update(_error_values(error))
    try:
        if to is Status.QUEUED:
            # Stopped to make room (a preemption, a stopping host, the scheduler's reclaim): webhooks hear job.preempted.
            fresh = lease.db(lambda: requeue(session, job.id, reason=reason, spend_retry=verdict.spends_retry,
                                             guard=lease.fence(), values=values, preempted=verdict.outcome == "preempted"),
                             f"moving the job to {to.value}")
        else:
            lease.db(lambda: transition(session, job.id, to, expect=[Status.RUNNING, Status.CANCELLING], reason=reason,
                                        values=values or None, guard=lease.fence()), f"moving the job to {to.value}")
    except TransitionRefused as exc:
        what = {Status.QUEUED: "requeue", Status.FAILED: "fail"}.get(to, "final transition")
        log.warning("job %s: %s refused (%s)", job.id, what, exc, extra=lease.log_extra)
        return "requeue refused" if to is Status.QUEUED else to.value
    if to is Status.QUEUED:
        log.info("job %s: back in line at attempt %d; the scheduler places it again", fresh.id, fresh.attempt,
                 extra=lease.log_extra)
        return "requeued"
    return to.value


def note_attempt(lease: Lease, job: Job, note: str) -> None:
    """What the user should know about how this attempt started, on its record from the start."""
    _update_attempt(lease, job, "noting the attempt", note=note)


def _record_attempt(lease: Lease, job: Job, outcome: str | None, exit_code: int | None, error_type: str | None,
                    error_message: str | None, resumed: int | None) -> None:
    _update_attempt(lease, job, "recording the attempt", finished_at=utcnow(), outcome=outcome, exit_code=exit_code,
                    error_type=error_type, error_message=error_message, resumed_from_step=resumed)


def _update_attempt(lease: Lease, job: Job, what: str, **values: Any) -> None:
    def update() -> None:
        # Only while this supervisor still holds the job: a stale one must not rewrite the reconciler's "lost".
        holds = sa.exists().where(Job.id == lease.job_id, *lease.fence())
        lease.session.exec(  # type: ignore[call-overload]
            sa.update(Attempt).where(Attempt.job_id == job.id, Attempt.attempt == job.attempt, holds).values(**values))
        lease.session.commit()

    lease.db(update, what)


def _error_values(error: Failure) -> dict[str, object]:
    return {"error_type": error.type.value, "error_message": error.message, "error_traceback": error.traceback,
            "error_log_tail": error.log_tail, "exit_code": error.exit_code}


def _resumed_from(events_path: Path) -> int | None:
    """The step the attempt's trainer resumed from, as its 'training' status event says."""
    step = None
    try:
        with events_path.open("rb") as f:
            for line in f:
                if b'"phase":"training"' in line:
                    step = json.loads(line).get("resumed_from_step")
    except (OSError, ValueError):
        return None
    return step
