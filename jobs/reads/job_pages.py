"""Paged reads: an owner's jobs, newest first, and one job's metric points, each page with the cursor of the next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.infra import secrets
from jobs.reads import cursors
from jobs.store.models import Job, MetricPoint, Status


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_cursor: str | None


# What a job list needs of each row: every column but the spec and the long error texts, and of the
# spec only what progress bars read. Lists stay bounded however large specs and tracebacks grow.
_SUMMARY_COLUMNS = [c for c in Job.__table__.columns if c.name not in ("spec", "error_traceback", "error_log_tail")]  # type: ignore[attr-defined]
_SPEC_SUMMARY = {
    "parallel": ("parallel",), "train": ("train",), "model_name": ("model", "name"), "data_name": ("data", "name"),
    "data_samples": ("data", "args", "samples"),
}


@dataclass(frozen=True)
class JobSummary:
    """One row of a job list: the job's columns without its spec, and a summary of the spec."""

    values: dict[str, Any]
    spec: dict[str, Any]
    secret_names: list[str]


def _summary_spec(row: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": row.kind}
    for name in ("parallel", "train"):
        if isinstance(getattr(row, f"s_{name}"), dict):
            spec[name] = getattr(row, f"s_{name}")
    if row.s_model_name is not None:
        spec["model"] = {"name": row.s_model_name}
    if row.s_data_name is not None:
        spec["data"] = {"name": row.s_data_name}
        if row.s_data_samples is not None:
            spec["data"]["args"] = {"samples": row.s_data_samples}
    return spec


def list_jobs(
    session: Session, owner: str | None, *, status: list[Status] | None = None, name: str | None = None,
    labels: dict[str, str] | None = None, limit: int = 50, cursor: str | None = None,
) -> Page:
    """``owner``'s jobs (None: every owner's), newest first, as JobSummary items. Ids sort by creation time, so the
    cursor is the last id seen."""
    spec_parts = [Job.spec[path].label(f"s_{key}") for key, path in _SPEC_SUMMARY.items()]  # type: ignore[index]
    query = sa.select(*_SUMMARY_COLUMNS, *spec_parts)
    if owner is not None:
        query = query.where(Job.owner == owner)
    if status:
        query = query.where(Job.status.in_([s.value for s in status]))  # type: ignore[attr-defined]
    if name:
        query = query.where(Job.name == name)
    if cursor:
        query = query.where(Job.id < cursors.parse_job_cursor(cursor))
    query = query.order_by(Job.id.desc())  # type: ignore[attr-defined]
    if labels:
        # Label filters run in Python: JSON operators differ between SQLite and PostgreSQL.
        matched = []
        for row in session.exec(query):  # type: ignore[call-overload]
            if all(row.labels.get(k) == v for k, v in labels.items()):
                matched.append(row)
                if len(matched) > limit:
                    break
        rows = matched
    else:
        rows = list(session.exec(query.limit(limit + 1)))  # type: ignore[call-overload]
    more = len(rows) > limit
    rows = rows[:limit]
    names = secrets.names(session, [row.id for row in rows])
    items = [JobSummary({c.name: getattr(row, c.name) for c in _SUMMARY_COLUMNS}, _summary_spec(row), names.get(row.id, []))
             for row in rows]
    return Page(items, cursors.job_cursor(rows[-1].id) if more else None)


def metric_points(
    session: Session, job_id: str, *, names: list[str] | None = None, since_step: int | None = None,
    limit: int = 1000, cursor: str | None = None,
) -> Page:
    """Ordered by (step, name); the cursor is the last (step, name) returned."""
    query = sa.select(MetricPoint).where(MetricPoint.job_id == job_id)
    if names:
        query = query.where(MetricPoint.name.in_(names))  # type: ignore[attr-defined]
    if since_step is not None:
        # Steps are INTEGER columns; a bound past their range (the API takes any BIGINT) is compared as one, where
        # PostgreSQL would refuse to cast it to the column's type.
        query = query.where(MetricPoint.step >= sa.literal(since_step, sa.BigInteger))
    if cursor:
        step, name = cursors.parse_metric_cursor(cursor)
        # A row-value comparison, so the (job_id, step, name) index serves it as one range (an OR of two does not).
        query = query.where(sa.tuple_(MetricPoint.step, MetricPoint.name) > sa.tuple_(sa.literal(step), sa.literal(name)))
    query = query.order_by(MetricPoint.step, MetricPoint.name).limit(limit + 1)
    rows = list(session.exec(query).scalars())  # type: ignore[call-overload]
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, cursors.metric_cursor(rows[-1].step, rows[-1].name) if more else None)
