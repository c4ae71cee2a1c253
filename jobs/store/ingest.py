"""Events from a run directory's events.jsonl into SQL, idempotently.

Events at or below the job's ``last_seq`` were already stored and are skipped; metric
points are keyed by (job, name, step), so an attempt that resumes from a checkpoint and
replays later steps overwrites them instead of duplicating. The high-water mark and the
rows commit together, so a crash between batches loses or doubles nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, SQLModel

from jobs.store.models import Checkpoint, Job, MetricPoint, utcnow

log = logging.getLogger(__name__)


def _upsert(session: Session, model: type[SQLModel], rows: list[dict[str, Any]], keys: list[str], update: list[str]) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(model.__table__)  # type: ignore[attr-defined]
    if update:
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_={c: stmt.excluded[c] for c in update})
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=keys)
    # One statement executed for many rows (DBAPI executemany; psycopg pipelines it): its compiled form
    # is cached. A multi-row VALUES built per batch cost more to compile than to run (bench/ingest_bench.py).
    session.connection().execute(stmt, rows)


def _when(event: dict[str, Any]) -> datetime:
    stamp = event.get("time")
    return datetime.fromtimestamp(stamp, timezone.utc) if isinstance(stamp, (int, float)) else utcnow()


class Fenced(Exception):
    """The writer no longer holds the job (its attempt was requeued or finished): nothing of its batch was stored."""


def ingest_events(session: Session, job_id: str, events: list[dict[str, Any]], guard: list[Any] | None = None) -> int:
    """Store new events of ``job_id``; returns how many were new. Commits.

    ``guard``: conditions on the job row (a supervisor's attempt, worker and status) checked by the same
    transaction's UPDATE of the high-water mark; when they fail, the whole batch rolls back and Fenced is raised."""
    last_seq = session.exec(sa.select(Job.last_seq).where(Job.id == job_id)).scalar_one()  # type: ignore[call-overload]
    fresh = [e for e in events if isinstance(e.get("seq"), int) and e["seq"] > last_seq]
    if not fresh:
        return 0
    metrics: dict[tuple[str, int], dict[str, Any]] = {}
    checkpoints: dict[int, dict[str, Any]] = {}
    latest: dict[str, float] = {}
    last_step: int | None = None
    for event in fresh:
        kind, step = event.get("type"), event.get("step")
        if kind == "metric" and isinstance(step, int):
            for name, value in (event.get("values") or {}).items():
                if isinstance(value, (int, float)):
                    metrics[(name, step)] = {
                        "job_id": job_id, "name": name, "step": step, "epoch": event.get("epoch"),
                        "value": float(value), "time": float(event.get("time", 0.0)), "seq": event["seq"],
                    }
                    latest[name] = float(value)
            last_step = step if last_step is None else max(last_step, step)
        elif kind == "checkpoint" and isinstance(step, int) and isinstance(event.get("path"), str):
            details = {k: v for k, v in event.items() if k not in {"seq", "time", "type", "step", "epoch", "path"}}
            checkpoints[step] = {
                "job_id": job_id, "step": step, "epoch": event.get("epoch"), "path": event["path"],
                "seq": event["seq"], "details": details, "created_at": _when(event),
            }
    _upsert(session, MetricPoint, list(metrics.values()), ["job_id", "name", "step"], ["value", "epoch", "time", "seq"])
    _upsert(session, Checkpoint, list(checkpoints.values()), ["job_id", "step"], ["path", "epoch", "seq", "details"])

    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    values: dict[str, Any] = {"last_seq": max(e["seq"] for e in fresh)}
    if last_step is not None:
        values["last_step"] = max(job.last_step or 0, last_step)
    if latest:
        values["latest_metrics"] = {**job.latest_metrics, **latest}
    # One guarded UPDATE: it takes the row's lock, so a reconciler's requeue commits wholly before or after it.
    done = session.exec(sa.update(Job).where(Job.id == job_id, *(guard or [])).values(**values))  # type: ignore[call-overload]
    if done.rowcount != 1:
        session.rollback()
        raise Fenced(f"job {job_id}: events not stored, the writer no longer holds the job")
    session.commit()
    return len(fresh)
