"""Which change is which event, and the outbox row that records it in the change's own transaction."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from jobs.store.models import Status
from jobs.webhooks.models import WebhookEvent

JOB_STARTED, JOB_SUCCEEDED, JOB_FAILED = "job.started", "job.succeeded", "job.failed"
JOB_CANCELLED, JOB_PREEMPTED, SWEEP_FINISHED = "job.cancelled", "job.preempted", "sweep.finished"
HOST_DRAINED, GPU_QUARANTINED = "host.drained", "gpu.quarantined"  # the admin's webhooks only
TYPES = (JOB_STARTED, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED, JOB_PREEMPTED, SWEEP_FINISHED, HOST_DRAINED, GPU_QUARANTINED)
# A host's history kinds (jobs/hosts/states.py) that are sent; an undrain or a clear is not news to page anyone about.
_BY_HOST_KIND = {"drain": HOST_DRAINED, "quarantine": GPU_QUARANTINED}
HOSTS_OWNER = "admin"  # host events belong to no tenant: owned by the admin's name, only the admin's webhooks hear them

_BY_STATUS = {Status.RUNNING: JOB_STARTED, Status.SUCCEEDED: JOB_SUCCEEDED, Status.FAILED: JOB_FAILED,
              Status.CANCELLED: JOB_CANCELLED}


def job_event(to: Status, *, preempted: bool = False) -> str | None:
    """The event a job's move to ``to`` sends. Back to ``queued`` is ``job.preempted`` only where the job was
    stopped to make room (its attempt's outcome is 'preempted'); a retry or a lost worker sends nothing, and
    neither does ``cancelling`` (the ``cancelled`` that follows does)."""
    if to is Status.QUEUED:
        return JOB_PREEMPTED if preempted else None
    return _BY_STATUS.get(to)


def record_job(session: Session, kind: str, *, job_id: str, name: str | None, owner: str, status: str, attempt: int,
               error_type: str | None, error_message: str | None, reason: str) -> None:
    """Add the outbox row of a job event to the caller's transaction (committed, or rolled back, with the change)."""
    error = None if error_type is None and error_message is None else {"type": error_type, "message": error_message}
    session.add(WebhookEvent(type=kind, owner=owner, payload={"job": {
        "id": job_id, "name": name, "owner": owner, "status": status, "attempt": attempt, "error": error,
        "reason": reason}}))


def record_host(session: Session, kind: str, *, host_id: str, actor: str, reason: str | None, gpu: int | None) -> None:
    """Add the outbox row of a drain or a quarantine (a host history ``kind``) to the caller's transaction."""
    event = _BY_HOST_KIND.get(kind)
    if event is not None:
        session.add(WebhookEvent(type=event, owner=HOSTS_OWNER, payload={"host": {
            "id": host_id, "gpu": gpu, "state": "quarantined" if gpu is not None else "draining", "reason": reason, "by": actor}}))


def record_sweep(session: Session, *, sweep_id: str, name: str, owner: str, status: str, message: str | None,
                 best_trial: int | None, best_value: float | None) -> None:
    """Add the outbox row of a sweep that ended to the caller's transaction."""
    sweep: dict[str, Any] = {"id": sweep_id, "name": name, "owner": owner, "status": status, "message": message,
                             "best_trial": best_trial, "best_value": best_value}
    session.add(WebhookEvent(type=SWEEP_FINISHED, owner=owner, payload={"sweep": sweep}))
