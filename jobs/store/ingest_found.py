"""What the worker finds in a job's directory (TensorBoard scalars, framework checkpoints) into SQL.

These rows do not come from events.jsonl, so they have no seq of the SDK's. They get seqs of their
own, counted from FOUND_BASE upwards (far above any seq a trainer writes), so the event feed sends
them in order and the SDK's high-water mark (``jobs.last_seq``) is never moved by them. Metric points
are keyed by (job, name, step) and checkpoints by (job, step), as the SDK's. A new attempt reads the
files from their start: a point stored already with the same value is left alone (no new seq, so a
follower sees the resume, not the history again); one with another value (the resumed run's) overwrites it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.ingest import Fenced, _upsert
from jobs.store.models import Checkpoint, Job, MetricPoint

FOUND_BASE = 2**30  # seq columns are 32-bit in SQL; a trainer never writes a billion events
MAX_STEP = 2**31 - 1  # job_metrics.step and job_checkpoints.step are INTEGER
MAX_NAME = 128  # job_metrics.name is VARCHAR(128)


@dataclass(frozen=True)
class FoundPoint:
    name: str
    step: int
    value: float
    time: float


@dataclass(frozen=True)
class FoundCheckpoint:
    step: int  # -1: unknown, stored at the job's step when it was found
    path: str  # relative to the run directory
    mtime: float
    details: dict[str, Any] = field(default_factory=dict)


def storable(points: Sequence[FoundPoint], checkpoints: Sequence[FoundCheckpoint],
             now: float | None = None) -> tuple[list[FoundPoint], list[FoundCheckpoint]]:
    """What SQL can hold of what a job's own files say (pure). A NaN or infinite value (a diverged loss) is a gap in
    its curve, as the SDK's are: neither the column nor JSON holds one. A point at a step beyond the INTEGER column,
    named with a NUL (which PostgreSQL text refuses), or with no name or one longer than the name column, is left
    out; a time that is no finite number is the time read. A checkpoint whose file names a step beyond the column (a
    millisecond timestamp) is one of unknown step."""
    read_at = time.time() if now is None else now
    kept = [p if math.isfinite(p.time) else FoundPoint(p.name, p.step, p.value, read_at) for p in points
            if math.isfinite(p.value) and 0 <= p.step <= MAX_STEP and 0 < len(p.name) <= MAX_NAME and "\x00" not in p.name]
    ckpts = [c if c.step <= MAX_STEP else FoundCheckpoint(-1, c.path, c.mtime, c.details) for c in checkpoints]
    return kept, ckpts


def last_found_seq(session: Session, job_id: str) -> int:
    """The highest found seq already stored for ``job_id`` (FOUND_BASE when none)."""
    high = FOUND_BASE
    for model in (MetricPoint, Checkpoint):
        value = session.exec(sa.select(sa.func.max(model.seq)).where(  # type: ignore[call-overload]
            model.job_id == job_id, model.seq > FOUND_BASE)).scalar_one()  # type: ignore[arg-type]
        high = max(high, value or FOUND_BASE)
    session.commit()
    return high


def _changed(session: Session, job_id: str, points: Sequence[FoundPoint]) -> list[FoundPoint]:
    """``points`` less those stored already with the same value (a new attempt reading the files again)."""
    if not points:
        return []
    steps = [p.step for p in points]
    stored = session.exec(sa.select(MetricPoint.name, MetricPoint.step, MetricPoint.value).where(  # type: ignore[call-overload]
        MetricPoint.job_id == job_id, MetricPoint.step >= min(steps), MetricPoint.step <= max(steps),  # type: ignore[arg-type]
        MetricPoint.name.in_({p.name for p in points})))  # type: ignore[attr-defined]
    have = {(name, step): value for name, step, value in stored}
    return [p for p in points if have.get((p.name, p.step)) != p.value]


def ingest_found(session: Session, job_id: str, after_seq: int, points: Sequence[FoundPoint],
                 checkpoints: Sequence[FoundCheckpoint] = (), guard: list[Any] | None = None) -> int:
    """Store ``points`` and ``checkpoints`` with seqs after ``after_seq``; returns the last seq used. Commits.
    One seq per step, so the feed sends one metric message per step. Fenced as ``ingest_events``. What the job's
    files say is kept to what SQL can hold first (``storable``)."""
    points, checkpoints = storable(points, checkpoints)
    points = _changed(session, job_id, points)
    if not points and not checkpoints:
        return after_seq
    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    seq = after_seq
    step_seq: dict[int, int] = {}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    latest: dict[str, tuple[int, float]] = {}
    for p in points:
        if p.step not in step_seq:
            seq += 1
            step_seq[p.step] = seq
        rows[(p.name, p.step)] = {"job_id": job_id, "name": p.name, "step": p.step, "epoch": None, "value": p.value,
                                  "time": p.time, "seq": step_seq[p.step]}
        if p.name not in latest or p.step >= latest[p.name][0]:
            latest[p.name] = (p.step, p.value)
    ckpt_rows: dict[int, dict[str, Any]] = {}
    for c in checkpoints:
        seq += 1
        step = c.step if c.step >= 0 else max(job.last_step or 0, max(step_seq, default=0))  # unknown: the job's step now
        ckpt_rows[step] = {"job_id": job_id, "step": step, "epoch": None, "path": c.path, "seq": seq,
                             "details": c.details, "created_at": datetime.fromtimestamp(c.mtime, timezone.utc)}
    _upsert(session, MetricPoint, list(rows.values()), ["job_id", "name", "step"], ["value", "epoch", "time", "seq"])
    _upsert(session, Checkpoint, list(ckpt_rows.values()), ["job_id", "step"], ["path", "epoch", "seq", "details", "created_at"])
    values: dict[str, Any] = {}
    if step_seq:
        values["last_step"] = max(job.last_step or 0, max(step_seq))
    if latest:
        values["latest_metrics"] = {**job.latest_metrics, **{name: v for name, (_, v) in latest.items()}}
    done = session.exec(sa.update(Job).where(Job.id == job_id, *(guard or [])).values(**values or {"id": job_id}))  # type: ignore[call-overload]
    if done.rowcount != 1:
        session.rollback()
        raise Fenced(f"job {job_id}: found metrics not stored, the writer no longer holds the job")
    session.commit()
    return seq
