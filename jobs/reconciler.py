"""Recovery of jobs whose worker or queue entry was lost. Run by every worker and by the API.

Two passes, each safe to run from many processes at once because every change is a guarded
transition (exactly one runner wins):

* running (or cancelling) jobs whose lease expired: the worker stopped heart-beating. The
  transition bumps ``attempt``, which fences the old supervisor: its next heartbeat matches
  no row, so it kills its process tree before anything else is written. The job is queued
  again, resuming from its latest checkpoint. A lost worker is not the job's fault, so like a
  preemption it spends no retry; only a job that has lost ``max_worker_losses`` workers (one
  that keeps taking its host down, say) is failed.
* queued jobs that Redis no longer holds (Redis restarted empty, an enqueue failed): enqueued
  again. A duplicate RQ entry is harmless: the claim is a guarded transition too.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import sqlalchemy as sa
from redis import Redis
from redis.exceptions import RedisError
from sqlmodel import Session

from jobs import queue, retry
from jobs.clock import db_now
from jobs.db import get_engine
from jobs.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.retention import expire_run_dirs
from jobs.settings import Settings
from jobs.states import TransitionRefused, transition

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Report:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    reenqueued: list[str] = field(default_factory=list)


def reconcile(session: Session, redis: Redis, *, enqueue_grace_s: float = 10.0, max_worker_losses: int = 3,
              retry_s: float = 5.0) -> Report:
    """One pass of both recoveries; each step retries through a database or Redis blip for up to ``retry_s``."""
    report = Report()
    _recover_expired_leases(session, redis, report, max_worker_losses, retry_s)
    _reenqueue_lost(session, redis, report, enqueue_grace_s, retry_s)
    return report


def _retried(session: Session, fn: Callable[[], T], what: str, retry_s: float) -> T:
    return retry.call(fn, deadline=retry_s, what=f"reconciler: {what}", on_retry=session.rollback)


def _recover_expired_leases(session: Session, redis: Redis, report: Report, max_worker_losses: int, retry_s: float) -> None:
    def find() -> list[tuple[str, str, str | None, int]]:
        now = db_now(session)  # the database's clock: workers' clocks may disagree with this host's
        # Plain values, not rows: a rollback (a refused transition, a blip) expires rows, and reading one
        # again would query the database from an error path.
        rows = session.exec(  # type: ignore[call-overload]
            sa.select(Job.id, Job.status, Job.worker_id, Job.attempt)
            .where(Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]),  # type: ignore[attr-defined]
                   Job.lease_expires_at < now)
        ).all()
        session.commit()
        return [tuple(row) for row in rows]

    for job_id, status, worker, attempt in _retried(session, find, "finding expired leases", retry_s):
        try:
            recover = functools.partial(_recover_one, session, redis, report, max_worker_losses, job_id, status, worker, attempt)
            _retried(session, recover, f"recovering job {job_id}", retry_s)
        except TransitionRefused:
            continue  # another reconciler, or the worker itself, got there first


def _recover_one(session: Session, redis: Redis, report: Report, max_worker_losses: int, job_id: str, status: str,
                 worker: str | None, attempt: int) -> None:
    lost = f"worker {worker} stopped heart-beating (lease expired)"
    _close_attempt(session, job_id, attempt)
    # Every transition also names the attempt it recovers: had a supervisor requeued it meanwhile and
    # another claimed it, the job would be running again under a fresh lease, and must stay so.
    guard = [Job.attempt == attempt]
    if status == Status.CANCELLING.value:
        transition(session, job_id, Status.CANCELLED, expect=[Status.CANCELLING], reason=f"cancelled; {lost}",
                   values={"attempt": Job.attempt + 1}, guard=guard)
        report.cancelled.append(job_id)
    elif worker_losses(session, job_id) <= max_worker_losses:
        fresh = transition(session, job_id, Status.QUEUED, expect=[Status.RUNNING], reason=f"{lost}; requeued",
                           values={**_lost_values(lost), "max_attempts": Job.max_attempts + 1}, guard=guard)
        queue.enqueue(redis, fresh)
        report.requeued.append(job_id)
    else:
        transition(session, job_id, Status.FAILED, expect=[Status.RUNNING],
                   reason=f"{lost}; {max_worker_losses} workers lost already", values=_lost_values(lost),
                   guard=guard)
        report.failed.append(job_id)


def _lost_values(message: str) -> dict[str, object]:
    # Bumping the attempt is what fences the old supervisor out (its heartbeat is keyed on it).
    return {"error_type": ErrorType.WORKER_LOST.value, "error_message": message, "worker_id": None,
            "lease_expires_at": None, "attempt": Job.attempt + 1}


def worker_losses(session: Session, job_id: str) -> int:
    """Attempts of the job that ended with a lost worker (or, for a multi-node job, a lost node)."""
    query = sa.select(sa.func.count()).select_from(Attempt).where(Attempt.job_id == job_id, Attempt.outcome == "lost")
    return session.exec(query).scalar_one()  # type: ignore[call-overload]


def _close_attempt(session: Session, job_id: str, attempt: int) -> None:
    row = session.get(Attempt, (job_id, attempt))
    if row is not None and row.finished_at is None:
        row.finished_at, row.outcome, row.error_type = utcnow(), "lost", ErrorType.WORKER_LOST.value
        session.add(row)
        session.commit()


def _reenqueue_lost(session: Session, redis: Redis, report: Report, grace_s: float, retry_s: float) -> None:
    def find() -> list[Job]:
        # A job queued moments ago may not have reached Redis yet; give the submitter time.
        cutoff = utcnow() - timedelta(seconds=grace_s)
        rows = session.exec(  # type: ignore[call-overload]
            sa.select(Job).where(Job.status == Status.QUEUED.value, Job.updated_at < cutoff)
        ).scalars().all()
        session.commit()
        session.expunge_all()  # detached, fully loaded: nothing below reads them back from the database
        return list(rows)

    for job in _retried(session, find, "finding queued jobs", retry_s):
        try:
            if retry.call(lambda job=job: queue.is_waiting(redis, job), deadline=retry_s, what="reconciler: reading the queue"):
                continue
        except RedisError:
            return
        if queue.enqueue(redis, job):
            log.info("job %s: re-enqueued (Redis no longer held it)", job.id, extra={"job_id": job.id})
            report.reenqueued.append(job.id)


class ReconcilerLoop(threading.Thread):
    """Recovers jobs of dead workers and queue entries Redis lost, every ``interval_s``."""

    def __init__(self, settings: Settings, interval_s: float):
        super().__init__(name="torchyard-reconciler", daemon=True)
        self.settings, self.interval_s = settings, interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        engine = get_engine(self.settings.database_url)
        redis = queue.redis_client(self.settings.redis_url)
        while not self.stopped.wait(self.interval_s):
            try:
                with Session(engine, expire_on_commit=False) as session:
                    report = reconcile(session, redis, enqueue_grace_s=self.settings.lease_ttl_s,
                                       max_worker_losses=self.settings.max_worker_losses)
                    expire_run_dirs(session, self.settings)
                if any(vars(report).values()):
                    log.info("reconciled: %s", report)
            except Exception:  # noqa: BLE001 - the loop must outlive a passing database or Redis outage
                log.exception("reconcile pass failed")
