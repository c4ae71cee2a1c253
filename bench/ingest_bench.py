"""(5a) Metrics ingestion: metric points per second from events.jsonl into SQL, the supervisor's way
(worker.tail.EventTail, then jobs.store.ingest.ingest_events in batches of TORCHYARD_INGEST_BATCH).

Two shapes: catch-up (a long file read at once, as after a worker restart or a fast trainer) and
live (one metric event per poll, as the supervisor sees a job that logs slower than it polls).
The rank-0 side of reporting (its cost on step time) is measured by bench.training.throughput.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from sqlmodel import Session

from bench.common import Ctx, database, median, pct, pg_available
from jobs.settings import Settings
from jobs.store.db import make_engine
from jobs.store.ingest import ingest_events
from jobs.store.models import Job
from worker.tail import EventTail

log = logging.getLogger("bench.ingest")

VALUES = {"train/loss": 0.5, "train/lr": 1e-3, "train/samples_per_s": 15000.0, "train/step_time_s": 0.004,
          "train/mem_bytes": 4.2e8, "train/grad_norm": 0.9}  # what the trainer reports at each log step


def write_events(path: Path, n: int, first_seq: int = 1) -> None:
    with path.open("a") as f:
        for i in range(n):
            seq = first_seq + i
            f.write(json.dumps({"seq": seq, "time": 1.7e9 + seq, "type": "metric", "step": seq, "epoch": 0,
                                "values": {k: v * (1 + 1e-6 * seq) for k, v in VALUES.items()}}, separators=(",", ":")) + "\n")


def _job(session: Session, name: str) -> str:
    job = Job(owner="bench", name=name, status="running", spec={})
    session.add(job)
    session.commit()
    return job.id


def _supervisor_ingest(session: Session, job_id: str, tail: EventTail, batch: int) -> int:
    # The same as worker.intake.Intake.store.
    events = tail.read()
    stored = sum(ingest_events(session, job_id, events[i:i + batch]) for i in range(0, len(events), batch))
    tail.ack()  # only once stored: a failed commit is read again
    return stored


def ingest(ctx: Ctx) -> dict[str, Any]:
    n_events = 4000 if ctx.quick else 20_000
    n_live = 100 if ctx.quick else 300
    batch = Settings().ingest_batch
    kinds = ["sqlite"] + (["postgresql"] if pg_available() else [])
    results: dict[str, Any] = {}
    for kind in kinds:
        with database(kind, ctx.work) as url:
            engine = make_engine(url)
            with Session(engine, expire_on_commit=False) as session:
                path = ctx.work / f"events-{kind}-catchup.jsonl"
                write_events(path, n_events)
                job_id = _job(session, "catchup")
                t0 = time.perf_counter()
                stored = _supervisor_ingest(session, job_id, EventTail(path), batch)
                catchup_s = time.perf_counter() - t0
                assert stored == n_events, (stored, n_events)

                path = ctx.work / f"events-{kind}-live.jsonl"
                job_id = _job(session, "live")
                tail = EventTail(path)
                per_call = []
                for i in range(n_live):
                    write_events(path, 1, first_seq=i + 1)
                    t0 = time.perf_counter()
                    _supervisor_ingest(session, job_id, tail, batch)
                    per_call.append(time.perf_counter() - t0)
            engine.dispose()
        points = n_events * len(VALUES)
        results[kind] = {"events": n_events, "points": points, "catchup_s": catchup_s, "points_per_s": points / catchup_s,
                         "live_call_ms_median": median(per_call) * 1e3, "live_call_ms_p95": pct(per_call, 95) * 1e3}
        log.info("%s: %.0f points/s catch-up; live poll %.2f ms median", kind, points / catchup_s, results[kind]["live_call_ms_median"])
    return {"config": {"events": n_events, "values_per_event": len(VALUES), "ingest_batch": batch, "live_calls": n_live},
            "results": results}
