"""The read path's queries are index ranges: a stream's poll reads the rows it sends, not the job's history.

Each query the event feed and the metrics pages run is captured as executed and EXPLAINed on the same
connection. SQLite must SEARCH (an index range) every table it touches, never SCAN one; PostgreSQL, with
sequential scans priced out, must find an index for each (a missing index still shows a Seq Scan)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.reads import feed, job_lookup, job_pages
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.ingest import ingest_events
from jobs.store.models import Job, Status
from jobs.store.states import transition

TABLES = ("job_metrics", "job_checkpoints", "job_transitions")


def _history(n: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for i in range(1, n + 1):
        events.append({"seq": i, "time": float(i), "type": "metric", "step": i, "epoch": 0,
                       "values": {"train/loss": 1.0 / i, "train/lr": 0.1}})
        if i % 100 == 0:
            events.append({"seq": n + i, "time": float(i), "type": "checkpoint", "step": i, "epoch": 0,
                           "path": f"checkpoints/step_{i:08d}"})
    return sorted(events, key=lambda e: e["seq"])


@contextmanager
def _captured(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


def _plans(engine: sa.Engine, statements: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    plans = []
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if engine.dialect.name == "postgresql":
            cur.execute("SET enable_seqscan = off")
        for statement, parameters in statements:
            if not any(t in statement for t in TABLES):
                continue
            prefix = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
            cur.execute(prefix + statement, parameters)
            lines = [str(row[-1] if engine.dialect.name == "sqlite" else row[0]) for row in cur.fetchall()]
            plans.append((statement, "\n".join(lines)))
    finally:
        raw.close()
    return plans


def _assert_index_ranges(engine: sa.Engine, plans: list[tuple[str, str]]) -> None:
    """SQLite: no SCAN, and no search on job_id alone whose rows are then sorted (that reads the job's whole
    history). PostgreSQL: no Seq Scan, and no Filter (rows read from the index only to be thrown away)."""
    assert plans, "no query of the read path was captured"
    for statement, plan in plans:
        where = f"{plan}\n-- for --\n{statement}"
        if engine.dialect.name == "sqlite":
            assert not any(line.strip().startswith(f"SCAN {t}") for line in plan.splitlines() for t in TABLES), where
            whole_job = any(line.rstrip().endswith("(job_id=?)") for line in plan.splitlines())
            assert not (whole_job and "TEMP B-TREE" in plan), where
        else:
            assert not any(f"Seq Scan on {t}" in plan for t in TABLES), where
            assert "Filter:" not in plan, where


@pytest.fixture
def job_with_history(settings: Settings) -> str:
    engine = get_engine(settings.database_url)
    with Session(engine, expire_on_commit=False) as session:
        other = Job(owner="admin", name="other", spec={})
        job = Job(owner="admin", name="long", spec={})
        session.add_all([other, job])
        session.commit()
        ingest_events(session, other.id, _history(300))
        ingest_events(session, job.id, _history(2000))
        transition(session, job.id, Status.RUNNING, expect=[Status.QUEUED], reason="started")
    return job.id


def test_stream_polls_and_metric_pages_are_index_ranges(settings: Settings, job_with_history: str) -> None:
    engine = get_engine(settings.database_url)
    with Session(engine, expire_on_commit=False) as session, _captured(engine) as seen:
        job = job_lookup.get_job(session, "admin", job_with_history)
        first = feed.snapshot(session, job)
        fresh = feed.poll(session, job.id, feed.Cursor.parse(first.id))  # a new stream: the first batch only
        late = feed.poll(session, job.id, feed.Cursor(0, 1990))  # a caught-up stream: the few new rows
        page = job_pages.metric_points(session, job.id, limit=100)
        job_pages.metric_points(session, job.id, limit=100, cursor=page.next_cursor)
        job_pages.metric_points(session, job.id, names=["train/loss"], since_step=1500, limit=100)
    # What the polls sent: the new stream a full batch, the caught-up one only what came after its cursor.
    assert len(fresh.messages) == feed.BATCH and fresh.more
    assert sorted(m.event for m in late.messages) == ["checkpoint"] * 20 + ["metric"] * 10 + ["status"]
    _assert_index_ranges(engine, _plans(engine, seen))
