"""The numbers about jobs that ``/metrics`` exports (api/observability.py): jobs per status and per queue,
events ingested, and how long started jobs waited in line."""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import Job, Status, Transition


def status_counts(session: Session) -> dict[str, int]:
    rows = session.exec(sa.select(Job.status, sa.func.count()).group_by(Job.status))  # type: ignore[call-overload]
    counts = {s.value: 0 for s in Status}
    counts.update({status: int(n) for status, n in rows})
    return counts


def events_ingested_total(session: Session) -> int:
    """Events stored from every job's events.jsonl; ``last_seq`` only grows, so the sum is a counter."""
    return int(session.exec(sa.select(sa.func.coalesce(sa.func.sum(Job.last_seq), 0))).scalar_one())  # type: ignore[call-overload]


def dispatches_after(session: Session, after_id: int, limit: int = 5000) -> tuple[list[float], int]:
    """Seconds each job waited from queued to running, for transitions to running after ``after_id``;
    returns the latencies and the id to continue from."""
    started = list(session.exec(  # type: ignore[call-overload]
        sa.select(Transition).where(Transition.id > after_id, Transition.to_status == Status.RUNNING.value)
        .order_by(Transition.id).limit(limit)
    ).scalars())
    if not started:
        return [], after_id
    job_ids = {t.job_id for t in started}
    queued: dict[str, list[Transition]] = {}
    for t in session.exec(  # type: ignore[call-overload]
        sa.select(Transition).where(Transition.job_id.in_(job_ids), Transition.to_status == Status.QUEUED.value)  # type: ignore[attr-defined]
        .order_by(Transition.id)
    ).scalars():
        queued.setdefault(t.job_id, []).append(t)
    created = dict(session.exec(sa.select(Job.id, Job.created_at).where(Job.id.in_(job_ids))).all())  # type: ignore[call-overload, attr-defined]
    latencies = []
    for t in started:
        # The wait began at the job's last return to the queue before this start, else at submission.
        since = max((q.at for q in queued.get(t.job_id, []) if (q.id or 0) < (t.id or 0)), default=created.get(t.job_id))
        if since is not None:
            latencies.append(max(0.0, (t.at - since).total_seconds()))
    return latencies, started[-1].id or after_id


def queue_depths(session: Session) -> dict[str, int]:
    """Queued jobs in each queue, as the scheduler sees them (SQL, not Redis: nothing waits there)."""
    rows = session.exec(sa.select(Job.queue, sa.func.count()).where(Job.status == Status.QUEUED.value)  # type: ignore[call-overload]
                        .group_by(Job.queue)).all()
    return {name: int(n) for name, n in rows}
