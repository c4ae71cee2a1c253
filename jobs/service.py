"""Job service functions: everything the API does to jobs goes through here, so routes stay thin."""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from redis import Redis
from sqlmodel import Session

from jobs import queue
from jobs.models import Checkpoint, Job, MetricPoint, Status
from jobs.states import TransitionRefused, transition
from trainer.spec import JobSpec

log = logging.getLogger(__name__)


class JobNotFound(LookupError):
    def __init__(self, job_id: str):
        super().__init__(f"job {job_id} not found")


class JobConflict(Exception):
    """The request does not fit the job's current status (HTTP 409)."""


def submit(session: Session, redis: Redis, owner: str, spec: JobSpec) -> Job:
    """Record a checked spec as a queued job, then enqueue it. The row commits first:
    if Redis is down the job is still accepted and the reconciler enqueues it."""
    job = Job(
        owner=owner, name=spec.name, kind=spec.kind, queue=spec.queue, labels=dict(spec.labels),
        spec=spec.model_dump(mode="json"), max_attempts=spec.retries + 1,
    )
    session.add(job)
    session.commit()
    session.refresh(job)
    queue.enqueue(redis, job)
    log.info("job %s submitted by %s", job.id, owner, extra={"job_id": job.id})
    return job


def get_job(session: Session, owner: str, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.owner != owner:
        # Another owner's job is indistinguishable from a missing one.
        raise JobNotFound(job_id)
    return job


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_cursor: str | None


def _encode_cursor(*parts: Any) -> str:
    return base64.urlsafe_b64encode("|".join(str(p) for p in parts).encode()).decode()


def _decode_cursor(cursor: str | None, n: int) -> list[str] | None:
    if not cursor:
        return None
    try:
        parts = base64.b64decode(cursor.encode(), altchars=b"-_", validate=True).decode().split("|")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("malformed cursor") from exc
    if len(parts) != n:
        raise ValueError("malformed cursor")
    return parts


def list_jobs(
    session: Session, owner: str, *, status: list[Status] | None = None, name: str | None = None,
    labels: dict[str, str] | None = None, limit: int = 50, cursor: str | None = None,
) -> Page:
    """Newest first. Ids sort by creation time, so the cursor is the last id seen."""
    query = sa.select(Job).where(Job.owner == owner)
    if status:
        query = query.where(Job.status.in_([s.value for s in status]))  # type: ignore[attr-defined]
    if name:
        query = query.where(Job.name == name)
    after = _decode_cursor(cursor, 1)
    if after:
        query = query.where(Job.id < after[0])
    query = query.order_by(Job.id.desc())  # type: ignore[attr-defined]
    if labels:
        # Label filters run in Python: JSON operators differ between SQLite and PostgreSQL.
        matched: list[Job] = []
        for job in session.exec(query).scalars():  # type: ignore[call-overload]
            if all(job.labels.get(k) == v for k, v in labels.items()):
                matched.append(job)
                if len(matched) > limit:
                    break
        rows = matched
    else:
        rows = list(session.exec(query.limit(limit + 1)).scalars())  # type: ignore[call-overload]
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, _encode_cursor(rows[-1].id) if more else None)


def request_cancel(session: Session, redis: Redis, owner: str, job_id: str) -> Job:
    """Queued: cancelled at once and never runs. Running: ``cancelling``; its supervisor stops
    the whole process tree and finishes the transition. Terminal: JobConflict."""
    job = get_job(session, owner, job_id)
    for _ in range(3):
        status = Status(job.status)
        if status is Status.CANCELLING:
            return job
        if status.terminal:
            raise JobConflict(f"job {job_id} is already {status.value}")
        try:
            if status is Status.QUEUED:
                job = transition(session, job_id, Status.CANCELLED, expect=[Status.QUEUED], reason="cancelled by user")
                queue.dequeue(redis, job)
                return job
            return transition(session, job_id, Status.CANCELLING, expect=[Status.RUNNING], reason="cancel requested by user")
        except TransitionRefused:
            # It moved on (started, finished) while we looked; decide again on the fresh state.
            job = get_job(session, owner, job_id)
            session.refresh(job)
    raise JobConflict(f"job {job_id} keeps changing state; try again")


def retry(session: Session, redis: Redis, owner: str, job_id: str) -> Job:
    """Run a finished job again as a new job (``retry_of`` names the old one) that starts from the
    old job's latest checkpoint. Terminal states stay final, so history is never rewritten."""
    old = get_job(session, owner, job_id)
    if not Status(old.status).terminal:
        raise JobConflict(f"job {job_id} is {old.status}; only a finished job can be retried")
    saved = checkpoints(session, job_id)
    resume_from = str(Path(old.run_dir) / saved[-1].path) if saved and old.run_dir else None
    job = Job(
        owner=owner, name=old.name, kind=old.kind, queue=old.queue, labels=dict(old.labels), spec=dict(old.spec),
        max_attempts=old.spec.get("retries", 0) + 1, retry_of=old.id, resume_from=resume_from,
    )
    session.add(job)
    session.commit()
    session.refresh(job)
    queue.enqueue(redis, job)
    log.info("job %s retries job %s from %s", job.id, old.id, resume_from or "scratch", extra={"job_id": job.id})
    return job


def metric_points(
    session: Session, job_id: str, *, names: list[str] | None = None, since_step: int | None = None,
    limit: int = 1000, cursor: str | None = None,
) -> Page:
    """Ordered by (step, name); the cursor is the last (step, name) returned."""
    query = sa.select(MetricPoint).where(MetricPoint.job_id == job_id)
    if names:
        query = query.where(MetricPoint.name.in_(names))  # type: ignore[attr-defined]
    if since_step is not None:
        query = query.where(MetricPoint.step >= since_step)
    after = _decode_cursor(cursor, 2)
    if after:
        step, name = int(after[0]), after[1]
        query = query.where(sa.or_(MetricPoint.step > step, sa.and_(MetricPoint.step == step, MetricPoint.name > name)))
    query = query.order_by(MetricPoint.step, MetricPoint.name).limit(limit + 1)
    rows = list(session.exec(query).scalars())  # type: ignore[call-overload]
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, _encode_cursor(rows[-1].step, rows[-1].name) if more else None)


def checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    query = sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
    return list(session.exec(query).scalars())  # type: ignore[call-overload]
