"""Recovery of jobs whose worker or host was lost. Run by every worker and by the API.

Two passes, each safe to run from many processes at once because every change is a guarded
transition (exactly one runner wins):

* running (or cancelling) jobs whose lease expired: the worker stopped heart-beating. The
  transition bumps ``attempt``, which fences the old supervisor: its next heartbeat matches
  no row, so it kills its process tree before anything else is written. The job is queued
  again, resuming from its latest checkpoint. A lost worker is not the job's fault, so like a
  preemption it spends no retry; only a job that has lost ``max_worker_losses`` workers (one
  that keeps taking its host down, say) is failed.
  An attempt the scheduler placed that no host adopted (its task was lost with Redis, or its host
  died before starting it) lapses the same way; it was never started, so it is not a lost worker.
* running jobs with a node on a host that stopped heart-beating (a gang's other node died): requeued
  the same way, which frees every GPU of the placement and fences node 0's supervisor.

Queued jobs need no recovery: they are in SQL, and the scheduler reads them from there.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import sqlalchemy as sa
from redis import Redis
from sqlmodel import Session

from jobs.hosts.placement import node_label
from jobs.hosts.registry import read_hosts
from jobs.infra import queue, transient
from jobs.infra.clock import db_now
from jobs.lifecycle.retention import expire_run_dirs
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.store.states import TransitionRefused, loss_forgiven, requeue, transition, worker_losses

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Report:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)


def reconcile(session: Session, redis: Redis, *, enqueue_grace_s: float = 10.0, max_worker_losses: int = 3,
              retry_s: float = 5.0) -> Report:
    """One pass of both recoveries; each step tries again through a database blip for up to ``retry_s``.
    ``enqueue_grace_s`` is the lease: a host silent for that long is dead."""
    report = Report()
    _recover_expired_leases(session, redis, report, max_worker_losses, retry_s)
    _recover_dead_nodes(session, redis, report, max_worker_losses, retry_s, enqueue_grace_s)
    return report


def _retried(session: Session, fn: Callable[[], T], what: str, retry_s: float) -> T:
    return transient.call(fn, deadline=retry_s, what=f"reconciler: {what}", between_tries=session.rollback)


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
                 worker: str | None, attempt: int, lost: str | None = None) -> None:
    if lost is None and _never_adopted(session, job_id, attempt):
        _requeue_unstarted(session, report, job_id, status, worker, attempt)
        return
    lost = lost or f"worker {worker} stopped heart-beating (lease expired)"
    _close_attempt(session, job_id, attempt, lost)
    # Every transition also names the attempt it recovers: had a supervisor requeued it meanwhile and
    # another claimed it, the job would be running again under a fresh lease, and must stay so.
    guard = [Job.attempt == attempt]
    if status == Status.CANCELLING.value:
        transition(session, job_id, Status.CANCELLED, expect=[Status.CANCELLING], reason=f"cancelled; {lost}",
                   values={"attempt": Job.attempt + 1}, guard=guard)
        report.cancelled.append(job_id)
    elif loss_forgiven(worker_losses(session, job_id, attempt), max_worker_losses):
        requeue(session, job_id, reason=f"{lost}; requeued", spend_retry=False, guard=guard, values=_lost_values(lost))
        report.requeued.append(job_id)
    else:
        # Bumping the attempt is what fences the old supervisor out (its heartbeat is keyed on it).
        transition(session, job_id, Status.FAILED, expect=[Status.RUNNING],
                   reason=f"{lost}; {max_worker_losses} workers lost already",
                   values={**_lost_values(lost), "worker_id": None, "lease_expires_at": None, "attempt": Job.attempt + 1},
                   guard=guard)
        report.failed.append(job_id)


def _lost_values(message: str) -> dict[str, object]:
    return {"error_type": ErrorType.WORKER_LOST.value, "error_message": message}


def _close_attempt(session: Session, job_id: str, attempt: int, lost: str) -> None:
    row = session.get(Attempt, (job_id, attempt))
    if row is not None and row.finished_at is None:
        row.finished_at, row.outcome, row.error_type = utcnow(), "lost", ErrorType.WORKER_LOST.value
        row.error_message = lost
        session.add(row)
        session.commit()


def _never_adopted(session: Session, job_id: str, attempt: int) -> bool:
    row = session.get(Attempt, (job_id, attempt))
    return row is not None and row.worker_id is None and row.finished_at is None


def _requeue_unstarted(session: Session, report: Report, job_id: str, status: str, host: str | None, attempt: int) -> None:
    """A placement no host adopted within its lease: back in line, no retry or worker loss spent (nothing ran)."""
    row = session.get(Attempt, (job_id, attempt))
    if row is not None:
        row.finished_at, row.outcome = utcnow(), "not_started"
        session.add(row)
        session.commit()
    guard = [Job.attempt == attempt]
    why = f"host {host} did not start the attempt within its lease"
    if status == Status.CANCELLING.value:
        transition(session, job_id, Status.CANCELLED, expect=[Status.CANCELLING], reason=f"cancelled; {why}",
                   values={"attempt": Job.attempt + 1}, guard=guard)
        report.cancelled.append(job_id)
        return
    requeue(session, job_id, reason=f"{why}; requeued", spend_retry=False, guard=guard)
    report.requeued.append(job_id)


def _recover_dead_nodes(session: Session, redis: Redis, report: Report, max_worker_losses: int, retry_s: float,
                        lease_ttl_s: float) -> None:
    """Running jobs with a node other than node 0 on a dead host (node 0's own host is its supervisor's lease)."""
    def find() -> list[tuple[str, str, str | None, int, list[tuple[int, str]]]]:
        alive = {row.host.id for row in read_hosts(session, lease_ttl_s) if row.alive}
        rows = session.exec(sa.select(Job.id, Job.status, Job.worker_id, Job.attempt, Job.placement).where(  # type: ignore[call-overload]
            Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]), Job.placement.is_not(None))).all()  # type: ignore[attr-defined, union-attr]
        session.commit()
        found = []
        for job_id, status, worker, attempt, placement in rows:
            dead = [(n["node_rank"], n["host"]) for n in placement or [] if n.get("node_rank", 0) > 0 and n["host"] not in alive]
            if dead:
                found.append((job_id, status, worker, attempt, dead))
        return found

    for job_id, status, worker, attempt, dead in _retried(session, find, "finding nodes on dead hosts", retry_s):
        lost = ", ".join(node_label(r, h) for r, h in dead) + " stopped heart-beating"
        try:
            recover = functools.partial(_recover_one, session, redis, report, max_worker_losses, job_id, status, worker,
                                        attempt, lost)
            _retried(session, recover, f"recovering job {job_id}", retry_s)
        except TransitionRefused:
            continue


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
