"""(3) Dispatch latency: POST -> running and POST -> first metric, through a real API and an idle worker,
next to the time ``torchrun -m trainer`` alone takes to its first step.

Jobs go one at a time (the next POST waits until the worker is idle again). Times come from the
records, not from polling: ``running`` is the transition's timestamp in SQL, "first step written" is
the time of rank 0's first metric event. "First metric in SQL" (what GET /v1/jobs/{id} shows) is
found by polling the job row every 20 ms, which reads SQLite without going through the API.
"""

from __future__ import annotations

import logging
import time
from datetime import timezone
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import TOKEN, Ctx, Stack, database, median, metric_times, pct, read_events
from bench.training import run_trainer

log = logging.getLogger("bench.dispatch")


def tiny_spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": "mlp", "args": {"hidden": 16, "layers": 1}},
        "data": {"name": "synthetic-classification", "args": {"samples": 256, "eval_samples": 0, "features": 8}},
        "parallel": {"nproc_per_node": 1, "device": "cpu"},
        "train": {"max_steps": 3, "global_batch_size": 32, "log_every_steps": 1},
        "checkpoint": {"keep_last": 1},
    }


def _one_job(client: httpx.Client, engine: sa.Engine, stack: Stack, i: int) -> dict[str, float]:
    posted = time.time()
    job_id = client.post("/v1/jobs", json=tiny_spec(f"dispatch-{i}")).raise_for_status().json()["id"]
    acked = time.time()
    visible = None
    deadline = time.monotonic() + 300
    with engine.connect() as conn:
        while True:
            status, last_step = conn.execute(sa.text("SELECT status, last_step FROM jobs WHERE id = :id"), {"id": job_id}).one()
            conn.commit()  # a fresh snapshot each read
            if visible is None and last_step is not None:
                visible = time.time()
            if status in ("succeeded", "failed", "cancelled"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"dispatch job {job_id} did not finish")
            time.sleep(0.02)
        if status != "succeeded":
            raise RuntimeError(f"dispatch job {job_id} ended {status}")
        at = conn.execute(sa.text("SELECT at FROM job_transitions WHERE job_id = :id AND to_status = 'running' ORDER BY id LIMIT 1"),
                          {"id": job_id}).scalar_one()
    if isinstance(at, str):  # SQLite hands back text
        from datetime import datetime

        at = datetime.fromisoformat(at)
    running = at.replace(tzinfo=timezone.utc).timestamp() if at.tzinfo is None else at.timestamp()
    first = min(metric_times(read_events(stack.settings.runs_dir / job_id)).values())
    return {"post_response_s": acked - posted, "post_to_running_s": running - posted, "post_to_first_step_s": first - posted,
            "post_to_first_metric_in_sql_s": (visible or float("nan")) - posted, "running_to_first_step_s": first - running}


def dispatch(ctx: Ctx) -> dict[str, Any]:
    n = 10 if ctx.quick else 50
    alone_every = 5 if ctx.quick else 10
    poll = 0.5  # TORCHYARD_POLL_INTERVAL_S, the default
    jobs: list[dict[str, float]] = []
    alone: list[float] = []
    with database("sqlite", ctx.work) as url, Stack(ctx.work / "stack-dispatch", url, workers=1, poll_interval_s=poll) as stack:
        engine = sa.create_engine(url)
        with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
            _one_job(client, engine, stack, -1)  # warm-up: first fork, page cache
            for i in range(n):
                jobs.append(_one_job(client, engine, stack, i))
                if i % alone_every == 0:
                    # The same job, by hand, while the worker idles: what torchrun itself costs to the first step.
                    launched, events, _ = run_trainer(ctx, "alone", tiny_spec("alone"))
                    alone.append(min(metric_times(events).values()) - launched)
                    log.info("job %d: POST->running %.3fs  POST->first step %.2fs  torchrun alone %.2fs", i,
                             jobs[-1]["post_to_running_s"], jobs[-1]["post_to_first_step_s"], alone[-1])
        engine.dispose()
    keys = list(jobs[0])
    summary = {k: {"median": median([j[k] for j in jobs]), "p95": pct([j[k] for j in jobs], 95)} for k in keys}
    summary["torchrun_alone_to_first_step_s"] = {"median": median(alone), "p95": pct(alone, 95)}
    return {
        "config": {"jobs": n, "poll_interval_s": poll, "database": "sqlite", "worker": "1 idle RQ worker",
                   "job": "mlp hidden 16, 1 process, 3 steps, metrics every step", "torchrun_alone_runs": len(alone)},
        "jobs": jobs, "torchrun_alone_s": alone, "summary": summary,
        "ratios": {"post_to_first_step / torchrun_alone (medians)":
                   summary["post_to_first_step_s"]["median"] / summary["torchrun_alone_to_first_step_s"]["median"]},
    }
