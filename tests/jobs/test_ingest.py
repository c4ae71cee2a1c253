"""Event ingestion is idempotent: re-reading a file or replaying steps after a resume never duplicates."""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.ingest import ingest_events
from jobs.store.models import Checkpoint, Job, MetricPoint


def _metric(seq: int, step: int, loss: float) -> dict:
    return {"seq": seq, "time": float(seq), "type": "metric", "step": step, "epoch": 0, "values": {"train/loss": loss}}


def test_reingesting_and_resumed_replays_do_not_duplicate(settings: Settings) -> None:
    engine = get_engine(settings.database_url)
    with Session(engine) as session:
        job = Job(owner="admin", name="t", spec={})
        session.add(job)
        session.commit()
        first = [_metric(i, i * 10, 3.0 - i * 0.1) for i in range(1, 6)]
        first.append({"seq": 6, "time": 6.0, "type": "checkpoint", "step": 30, "epoch": 0, "path": "checkpoints/step_00000030"})
        assert ingest_events(session, job.id, first) == 6
        # The same file read again (a supervisor restarted from offset 0): nothing new.
        assert ingest_events(session, job.id, first) == 0
        # A new attempt resumed from step 30 replays steps 40 and 50 with fresh seqs.
        replay = [_metric(7, 40, 2.55), _metric(8, 50, 2.45), _metric(9, 60, 2.4)]
        assert ingest_events(session, job.id, replay) == 3
        points = session.exec(sa.select(MetricPoint).where(MetricPoint.job_id == job.id).order_by(MetricPoint.step)).scalars().all()
        assert [p.step for p in points] == [10, 20, 30, 40, 50, 60]
        assert [round(p.value, 2) for p in points][3:] == [2.55, 2.45, 2.4]
        assert len(session.exec(sa.select(Checkpoint).where(Checkpoint.job_id == job.id)).scalars().all()) == 1
        fresh = session.get(Job, job.id, populate_existing=True)
        assert fresh is not None and fresh.last_seq == 9 and fresh.last_step == 60
