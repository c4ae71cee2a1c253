"""What an owner does to an existing job: cancel it, change its priority, or delete a finished one with its rows and
run directory."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import sqlalchemy as sa
from redis import Redis
from sqlmodel import Session

from jobs.reads.job_lookup import get_job
from jobs.settings import Settings
from jobs.storage import job_objects
from jobs.store.models import Attempt, Checkpoint, IdempotencyKey, Job, JobSecret, MetricPoint, Status, Transition
from jobs.store.states import TransitionRefused, cancel_requested, cancelled, canceller, transition

log = logging.getLogger(__name__)


class JobConflict(Exception):
    """The request does not fit the job's current status."""


def request_cancel(session: Session, redis: Redis, owner: str | None, job_id: str, actor: str) -> Job:
    """Queued: cancelled at once and never runs. Running: ``cancelling``; its supervisor stops
    the whole process tree and finishes the transition. Terminal: JobConflict. The reasons say who asked: ``user``
    (the job's owner), or the ``actor`` (the admin) cancelling another owner's job."""
    job = get_job(session, owner, job_id)
    by = canceller(actor, job.owner)
    for _ in range(3):
        status = Status(job.status)
        if status is Status.CANCELLING:
            return job
        if status.terminal:
            raise JobConflict(f"job {job_id} is already {status.value}")
        try:
            if status is Status.QUEUED:
                return transition(session, job_id, Status.CANCELLED, expect=[Status.QUEUED], reason=cancelled(by))
            return transition(session, job_id, Status.CANCELLING, expect=[Status.RUNNING], reason=cancel_requested(by))
        except TransitionRefused:
            # It moved on (started, finished) while we looked; decide again on the fresh state.
            job = get_job(session, owner, job_id)
            session.refresh(job)
    raise JobConflict(f"job {job_id} keeps changing state; try again")


def set_priority(session: Session, owner: str | None, job_id: str, priority: int) -> Job:
    """A queued or running job's new priority. The scheduler reads it on its next pass: a queued job moves in line
    and may preempt lower-priority jobs; a running one may preempt or be preempted by it. Otherwise JobConflict."""
    job = get_job(session, owner, job_id)
    if job.status not in _PRIORITY_CHANGES:
        raise _no_priority_change(job)
    before = job.priority
    # Guarded on the status: a job that finished (or began cancelling) since the read keeps what it ran with.
    changed = session.exec(sa.update(Job).where(Job.id == job_id, Job.status.in_(_PRIORITY_CHANGES))  # type: ignore[call-overload, attr-defined]
                           .values(priority=priority))
    if changed.rowcount != 1:
        session.rollback()
        session.refresh(job)
        raise _no_priority_change(job)
    session.commit()
    session.refresh(job)
    log.info("job %s of %s: priority %d -> %d%s", job_id, job.owner, before, priority, "" if owner else " by the admin")
    return job


_PRIORITY_CHANGES = (Status.QUEUED.value, Status.RUNNING.value)


def _no_priority_change(job: Job) -> JobConflict:
    return JobConflict(f"job {job.id} is {job.status}; only a queued or running job's priority can change")


def delete_job(session: Session, settings: Settings, owner: str | None, job_id: str) -> None:
    """Delete a finished job: its rows (metrics, checkpoints, attempts, transitions, secrets, idempotency
    keys, the job) in one transaction, then its run directory and its objects in the store. A queued or running job: JobConflict."""
    job = get_job(session, owner, job_id)
    if not Status(job.status).terminal:
        raise JobConflict(f"job {job_id} is {job.status}; cancel it first, only a finished job can be deleted")
    run_dir = Path(job.run_dir) if job.run_dir else None
    for model in (MetricPoint, Checkpoint, Attempt, Transition, JobSecret, IdempotencyKey):
        session.exec(sa.delete(model).where(model.job_id == job_id))  # type: ignore[call-overload, attr-defined]
    # Guarded on the status: a job that is terminal now stays so, but the check and the delete are one statement.
    deleted = session.exec(sa.delete(Job).where(Job.id == job_id, Job.status == job.status))  # type: ignore[call-overload]
    if deleted.rowcount != 1:
        session.rollback()
        raise JobConflict(f"job {job_id} changed while being deleted; try again")
    session.commit()
    if run_dir is not None:
        remove_run_dir(settings, run_dir)
    job_objects.remove(settings, job_id)


def remove_run_dir(settings: Settings, run_dir: Path) -> None:
    """Remove a job's run directory; only ever one directly under the runs directory."""
    root = settings.runs_dir.resolve()
    target = run_dir.resolve()
    if target.parent != root:
        log.warning("not removing %s: not a run directory under %s", target, root)
        return
    shutil.rmtree(target, ignore_errors=True)
