"""Usage, read from the attempts: the GPUs and CPU slots each attempt's placement held, times how long it held
them (placed until finished, or until now while it runs). Nothing is counted separately, so the figures cannot
drift from what ran; an attempt that crosses the window's edges, or midnight when grouped by day, is cut there.

``summarize`` is the policy, a pure function over spans; ``read_spans`` and ``totals_by_owner`` read SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import Attempt, Job

GROUPS = ("owner", "day")


@dataclass(frozen=True)
class Span:
    """One attempt as usage sees it."""

    owner: str
    job_id: str
    attempt: int
    started: datetime
    finished: datetime | None  # None: it still holds its placement
    gpus: int
    cpu_slots: int
    preempted: bool = False


@dataclass
class UsageRow:
    owner: str | None
    day: date | None
    gpu_hours: float = 0.0
    cpu_slot_hours: float = 0.0
    preempted_gpu_hours: float = 0.0
    job_ids: set[str] = field(default_factory=set)
    attempts: int = 0

    def as_dict(self, group_by: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "owner" in group_by:
            out["owner"] = self.owner
        if "day" in group_by:
            out["day"] = self.day.isoformat() if self.day else None
        out.update(gpu_hours=round(self.gpu_hours, 6), cpu_slot_hours=round(self.cpu_slot_hours, 6), jobs=len(self.job_ids),
                   attempts=self.attempts, preempted_gpu_hours=round(self.preempted_gpu_hours, 6))
        return out


def parse_group_by(text: str) -> tuple[str, ...]:
    """``owner``, ``day`` or both, comma-separated, in the order given; raises ValueError in the user's words."""
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in GROUPS]
    if not parts or unknown or len(set(parts)) != len(parts):
        raise ValueError(f"group_by: {text!r} is not one of owner, day or owner,day")
    return parts


def as_utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _pieces(lo: datetime, hi: datetime, by_day: bool) -> Iterable[tuple[date | None, float]]:
    """(day, seconds) of [lo, hi), split at UTC midnights when ``by_day``."""
    if not by_day:
        yield None, (hi - lo).total_seconds()
        return
    while True:
        midnight = datetime.combine(lo.date() + timedelta(days=1), time(), timezone.utc)
        if hi <= midnight:
            yield lo.date(), (hi - lo).total_seconds()
            return
        yield lo.date(), (midnight - lo).total_seconds()
        lo = midnight


def summarize(spans: Iterable[Span], start: datetime | None, end: datetime | None, now: datetime,
              group_by: Sequence[str] = ("owner",)) -> list[UsageRow]:
    """Usage per group over [start, end) (either open), running attempts counted until ``now``.

    An attempt counts in a group when it held its placement for some time inside the window and the group (a
    zero-length one, inside the window, counts with no hours). Rows are sorted by owner, then day."""
    now = as_utc(now)
    start = as_utc(start) if start is not None else None
    end = min(as_utc(end), now) if end is not None else now
    by_owner, by_day = "owner" in group_by, "day" in group_by
    rows: dict[tuple[str | None, date | None], UsageRow] = {}
    for s in spans:
        began = as_utc(s.started)
        stopped = min(as_utc(s.finished), now) if s.finished is not None else now
        lo = max(began, start) if start is not None else began
        hi = min(stopped, end)
        if hi < lo or (hi == lo and not (began == stopped == lo and hi < end)):
            continue
        owner = s.owner if by_owner else None
        pieces = list(_pieces(lo, hi, by_day)) if hi > lo else [(lo.date() if by_day else None, 0.0)]
        for day, seconds in pieces:
            row = rows.get((owner, day))
            if row is None:
                row = rows[(owner, day)] = UsageRow(owner, day)
            hours = seconds / 3600
            row.gpu_hours += s.gpus * hours
            row.cpu_slot_hours += s.cpu_slots * hours
            if s.preempted:
                row.preempted_gpu_hours += s.gpus * hours
            row.job_ids.add(s.job_id)
            row.attempts += 1
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0] or "", k[1] or date.min))]


def held(placement: list[dict[str, Any]] | None) -> tuple[int, int]:
    """(GPUs, CPU slots) an attempt's stored placement holds, over all its nodes."""
    nodes = placement or []
    return sum(len(n.get("gpus") or ()) for n in nodes), sum(int(n.get("cpu_slots") or 0) for n in nodes)


def read_spans(session: Session, owner: str | None = None, start: datetime | None = None,
               end: datetime | None = None) -> list[Span]:
    """The attempts (of ``owner``, or every owner's) that held a placement at some time in [start, end)."""
    query = (sa.select(Job.owner, Attempt.job_id, Attempt.attempt, Attempt.started_at, Attempt.finished_at, Attempt.placement,
                       Attempt.outcome)
             .join(Job, Job.id == Attempt.job_id))  # type: ignore[arg-type]
    if owner is not None:
        query = query.where(Job.owner == owner)
    if end is not None:
        query = query.where(Attempt.started_at <= end)
    if start is not None:
        query = query.where(sa.or_(Attempt.finished_at.is_(None), Attempt.finished_at >= start))  # type: ignore[union-attr]
    spans = []
    for row_owner, job_id, attempt, started, finished, placement, outcome in session.exec(query).all():  # type: ignore[call-overload]
        gpus, cpu_slots = held(placement)
        spans.append(Span(row_owner, job_id, attempt, started, finished, gpus, cpu_slots, preempted=outcome == "preempted"))
    session.commit()
    return spans


def totals_by_owner(session: Session, now: datetime) -> dict[str, tuple[float, float]]:
    """All-time (GPU seconds, CPU slot seconds) per owner, running attempts until ``now``: Prometheus's counters."""
    return {row.owner or "": (row.gpu_hours * 3600, row.cpu_slot_hours * 3600)
            for row in summarize(read_spans(session), None, None, now, ("owner",))}
