"""What a job's own metric files say is its input: whatever they hold, storing it never fails the attempt. A NaN loss
once ended the node's task (SQLite refused it as NULL, PostgreSQL's JSON refused it in latest_metrics), and the job
failed on its lease; so would a step past the INTEGER column or a name with a NUL."""

from __future__ import annotations

import math
from pathlib import Path

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.settings import Settings
from jobs.store.ingest_found import MAX_NAME, MAX_STEP, FoundCheckpoint, FoundPoint, ingest_found, last_found_seq, storable
from jobs.store.models import Job, MetricPoint
from tests.helpers import plain_db, session_with_job
from worker.found import Found
from worker.run_files import Point

NOW = 1.8e9
points_st = st.builds(FoundPoint, st.text(max_size=MAX_NAME + 2), st.integers(-(2**40), 2**40), st.floats(), st.floats())


@given(st.lists(points_st, max_size=20), st.lists(st.integers(-1, 10**12), max_size=4))
def test_storable_keeps_every_point_sql_can_hold_as_it_is(points: list[FoundPoint], steps: list[int]) -> None:
    ckpts = [FoundCheckpoint(step, f"ckpt-{i}.pt", 1.0) for i, step in enumerate(steps)]
    kept, kept_ckpts = storable(points, ckpts, now=NOW)
    holdable = [p for p in points
                if math.isfinite(p.value) and 0 <= p.step <= MAX_STEP and 0 < len(p.name) <= MAX_NAME and "\x00" not in p.name]
    assert [(p.name, p.step, p.value) for p in kept] == [(p.name, p.step, p.value) for p in holdable]
    assert [p.time for p in kept] == [p.time if math.isfinite(p.time) else NOW for p in holdable]
    assert [c.step for c in kept_ckpts] == [s if s <= MAX_STEP else -1 for s in steps]  # -1: stored at the job's step


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(points_st, max_size=12), st.integers(0, 10**12))
def test_whatever_a_jobs_files_hold_stores_on_both_databases(settings: Settings, tmp_path: Path, points: list[FoundPoint],
                                                              ckpt_step: int) -> None:
    with session_with_job(settings, tmp_path) as (session, job):
        ingest_found(session, job.id, last_found_seq(session, job.id), points,
                     [FoundCheckpoint(ckpt_step, "out/ckpt.pt", 1.0)])
        stored = session.exec(sa.select(sa.func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job.id)).scalar_one()
        assert stored == len({(p.name, p.step) for p in storable(points, [])[0]})


def test_a_diverged_value_is_a_gap_not_a_failed_store(settings: Settings, tmp_path: Path) -> None:
    with session_with_job(settings, tmp_path) as (session, job):
        points = [FoundPoint("loss", 1, 0.5, 1.0), FoundPoint("loss", 2, math.nan, 2.0), FoundPoint("grad", 2, math.inf, 2.0),
                  FoundPoint("grad", 3, 1.5, 3.0)]
        ingest_found(session, job.id, last_found_seq(session, job.id), points)
        rows = session.exec(sa.select(MetricPoint.name, MetricPoint.step, MetricPoint.value).where(MetricPoint.job_id == job.id)
                            .order_by(MetricPoint.name, MetricPoint.step)).all()
        assert [tuple(r) for r in rows] == [("grad", 3, 1.5), ("loss", 1, 0.5)]
        fresh = session.get(Job, job.id, populate_existing=True)
        assert fresh is not None and fresh.latest_metrics == {"grad": 1.5, "loss": 0.5}


class _Tail:
    """Points no tail would offer (a name longer than the column), to reach what SQL itself refuses."""

    unreadable = None

    def __init__(self, points: list[Point]):
        self.points = points

    def read(self, force_scan: bool = False) -> list[Point]:
        return list(self.points)

    def ack(self, count: int) -> None:
        del self.points[:count]


def test_a_batch_sql_refuses_is_dropped_and_the_next_one_stored(settings: Settings, tmp_path: Path) -> None:
    with session_with_job(settings, tmp_path) as (session, job):
        found = Found(tmp_path)
        found.metrics = _Tail([Point("x" * 300, 1, 1.0, NOW), Point("loss", 2, 0.5, NOW)])  # type: ignore[assignment]

        found.ingest(session, job.id, [], plain_db, batch=1, final=True)
        rows = session.exec(sa.select(MetricPoint.name).where(MetricPoint.job_id == job.id)).scalars().all()
        # PostgreSQL refuses the 300-character name (VARCHAR(128)); SQLite keeps it. Either way loss is stored.
        assert "loss" in rows and found.metrics.read() == []
