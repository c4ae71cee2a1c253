"""The live event feed of one job (``GET /v1/jobs/{id}/events``), read from SQL by polling.

Three sources, each already ordered: status changes (``job_transitions.id``), and metric and
checkpoint events (their ``seq`` from events.jsonl). A cursor is the pair of high-water marks
``<transition id>-<seq>``; every message carries the cursor after it, so a client that
reconnects with Last-Event-ID gets exactly what it has not seen, whatever the interleaving.
Rows the worker found without the SDK (TensorBoard files, framework checkpoints) have seqs of
their own from FOUND_BASE up (jobs/store/ingest_found.py): their high-water mark is a third part,
``<transition id>-<seq>-<found seq>``, present once one was sent.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.reads import cursors
from jobs.store.ingest_found import FOUND_BASE
from jobs.store.models import Checkpoint, Job, MetricPoint, Status, Transition

# Upper bound of events read per poll; a longer backlog is sent over several polls without waiting.
BATCH = 500


@dataclass(frozen=True, order=True)
class Cursor:
    transition_id: int = 0
    seq: int = 0
    found: int = 0  # the last found seq sent (0: none yet)

    def encode(self) -> str:
        return cursors.event_id(self.transition_id, self.seq, self.found)

    @classmethod
    def parse(cls, raw: str) -> Cursor:
        """cursors.MalformedCursor (a ValueError) for anything but an id this server makes, numbers in SQL's range."""
        return cls(*cursors.parse_event_id(raw))


@dataclass(frozen=True)
class Message:
    event: str  # status | metric | checkpoint | end
    data: dict[str, Any]
    id: str


@dataclass
class Batch:
    messages: list[Message] = field(default_factory=list)
    cursor: Cursor = field(default_factory=Cursor)
    more: bool = False  # the backlog was cut at BATCH: poll again at once
    ended: bool = False  # the job is terminal and everything before ``end`` was sent


def _iso(at: datetime) -> str:
    return at.isoformat()


def _status_data(t: Transition) -> dict[str, Any]:
    return {"status": t.to_status, "reason": t.reason, "at": _iso(t.at), "attempt": t.attempt}


def snapshot(session: Session, job: Job) -> Message:
    """The first message of a fresh stream: the job's current status, from its latest transition."""
    last = session.exec(  # type: ignore[call-overload]
        sa.select(Transition).where(Transition.job_id == job.id).order_by(Transition.id.desc()).limit(1)  # type: ignore[union-attr]
    ).scalars().first()
    if last is None:
        data = {"status": job.status, "reason": "submitted", "at": _iso(job.created_at), "attempt": job.attempt}
        return Message("status", data, Cursor(0, 0).encode())
    return Message("status", _status_data(last), Cursor(last.id or 0, 0).encode())


def _checkpoint_path(run_dir: str | None, path: str) -> str:
    return str(Path(run_dir) / path) if run_dir else path


def _next_seqs(session: Session, model: type[MetricPoint] | type[Checkpoint], job_id: str, after: int, below: int) -> list[int]:
    """The first BATCH distinct seqs of ``model``'s rows of ``job_id`` in (after, below): an index range."""
    query = (sa.select(model.seq).where(model.job_id == job_id, model.seq > after, model.seq < below)  # type: ignore[arg-type]
             .distinct().order_by(model.seq).limit(BATCH))  # type: ignore[arg-type]
    return [row[0] for row in session.exec(query)]  # type: ignore[call-overload]


def _seq_ranges(session: Session, job_id: str, cursor: Cursor) -> tuple[list[tuple[int, int]], bool]:
    """The seq ranges (low exclusive, high inclusive) of the next batch, the SDK's and the found ones, and whether it was cut."""
    ranges, cut = [], False
    for after, below in ((cursor.seq, FOUND_BASE), (max(cursor.found, FOUND_BASE), cursors.SQL_INT4_MAX)):
        wanted = sorted(set(_next_seqs(session, MetricPoint, job_id, after, below))
                        | set(_next_seqs(session, Checkpoint, job_id, after, below)))[:BATCH]
        cut = cut or len(wanted) == BATCH
        if wanted:
            ranges.append((after, wanted[-1]))
    return ranges, cut


def poll(session: Session, job_id: str, cursor: Cursor) -> Batch:
    """Everything after ``cursor``, oldest first; ``end`` last once the job is terminal."""
    # Status first: the worker stores every event before its final transition commits, so a
    # terminal status read here guarantees the reads below see the job's last events.
    job = session.exec(sa.select(Job.status, Job.run_dir).where(Job.id == job_id)).one()  # type: ignore[call-overload]
    status, run_dir = job.status, job.run_dir

    changes = list(session.exec(  # type: ignore[call-overload]
        sa.select(Transition).where(Transition.job_id == job_id, Transition.id > cursor.transition_id)
        .order_by(Transition.id).limit(BATCH)
    ).scalars())

    # Each source is read along its (job_id, seq) index and cut at BATCH on its own, so a poll reads
    # O(new rows) and a fresh stream over a long history reads no more than the batch it sends.
    ranges, cut = _seq_ranges(session, job_id, cursor)
    events: list[tuple[float, int, Message | None, dict[str, Any]]] = []
    for low, high in ranges:
        points = session.exec(  # type: ignore[call-overload]
            sa.select(MetricPoint).where(MetricPoint.job_id == job_id, MetricPoint.seq > low, MetricPoint.seq <= high)
            .order_by(MetricPoint.seq, MetricPoint.name)
        ).scalars()
        by_seq: dict[int, dict[str, Any]] = {}
        for p in points:
            entry = by_seq.setdefault(p.seq, {"step": p.step, "epoch": p.epoch, "values": {}, "time": p.time})
            entry["values"][p.name] = p.value
        ckpts = session.exec(  # type: ignore[call-overload]
            sa.select(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.seq > low, Checkpoint.seq <= high)
        ).scalars()
        for seq, data in by_seq.items():
            events.append((data["time"], seq, None, {"event": "metric", **data}))
        for c in ckpts:
            data = {"step": c.step, "epoch": c.epoch, "path": _checkpoint_path(run_dir, c.path),
                    "created_at": _iso(c.created_at), "details": c.details}
            events.append((c.created_at.timestamp(), c.seq, None, {"event": "checkpoint", **data}))
        events.sort(key=lambda e: e[1])

    # Merge the two ordered sources by time so a reader sees "running" before that attempt's metrics.
    transition_items = [(t.at.timestamp(), 0, t) for t in changes]
    event_items = [(e[0], 1, e) for e in events]
    batch = Batch(cursor=cursor)
    t_id, seq, found = cursor.transition_id, cursor.seq, cursor.found
    for _, kind, item in heapq.merge(transition_items, event_items, key=lambda x: (x[0], x[1])):
        if kind == 0:
            t_id = item.id or t_id  # type: ignore[union-attr]
            batch.messages.append(Message("status", _status_data(item), Cursor(t_id, seq, found).encode()))  # type: ignore[arg-type]
        else:
            if item[1] >= FOUND_BASE:  # type: ignore[index]
                found = item[1]  # type: ignore[index]
            else:
                seq = item[1]  # type: ignore[index]
            payload = dict(item[3])  # type: ignore[index]
            batch.messages.append(Message(payload.pop("event"), payload, Cursor(t_id, seq, found).encode()))
    batch.cursor = Cursor(t_id, seq, found)
    batch.more = len(changes) == BATCH or cut
    if Status(status).terminal and not batch.more:
        batch.messages.append(Message("end", {"status": status}, batch.cursor.encode()))
        batch.ended = True
    return batch
