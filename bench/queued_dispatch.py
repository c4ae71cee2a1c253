"""(11c) POST -> running with 1,000 jobs queued, on the real service: the API, one worker (which leads the
scheduler), SQLite, a private Redis.

The backlog is jobs that can never run here (two nodes on a one-host cluster), so every pass of the
scheduler reads and considers all of them, as it would a long queue, while each measured job (one CPU
rank, 3 steps) fits at once. Measured jobs go one at a time, as in the dispatch suite; ``running`` is the
transition's timestamp in SQL. The scheduler polls every TORCHYARD_POLL_INTERVAL_S (0.5 s), which bounds
the median from below at about half of it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import TOKEN, Ctx, Stack, database, median, pct
from bench.dispatch import _one_job, tiny_spec

log = logging.getLogger("bench.queued_dispatch")


def queued_dispatch(ctx: Ctx) -> dict[str, Any]:
    backlog = 200 if ctx.quick else 1000
    n = 10 if ctx.quick else 40
    poll = 0.5
    jobs: list[dict[str, float]] = []
    with database("sqlite", ctx.work) as url, Stack(ctx.work / "stack-queued", url, workers=1, poll_interval_s=poll,
                                                    TORCHYARD_WORKER_CPU_SLOTS="1") as stack:
        engine = sa.create_engine(url)
        with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as client:
            started = time.monotonic()
            for i in range(backlog):
                body = tiny_spec(f"backlog-{i}")
                body["parallel"]["nnodes"] = 2
                client.post("/v1/jobs", json=body).raise_for_status()
            log.info("backlog of %d queued in %.1fs", backlog, time.monotonic() - started)
            _one_job(client, engine, stack, -1)  # warm-up: first fork, page cache, the backlog's reasons stored
            for i in range(n):
                jobs.append(_one_job(client, engine, stack, i))
                log.info("job %d: POST->running %.3fs", i, jobs[-1]["post_to_running_s"])
            with engine.connect() as conn:
                waiting = conn.execute(sa.text(
                    "SELECT count(*) FROM jobs WHERE status = 'queued' AND waiting_reason IS NOT NULL")).scalar_one()
        engine.dispose()
    running = [j["post_to_running_s"] for j in jobs]
    return {
        "config": {"backlog_queued": backlog, "jobs": n, "poll_interval_s": poll, "database": "sqlite",
                   "worker": "1 worker, 1 CPU slot, leading the scheduler", "job": "mlp hidden 16, 1 process, 3 steps"},
        "backlog_with_stored_reason": waiting,
        "post_to_running_s": running,
        "summary": {"post_to_running_s": {"p50": median(running), "p99": pct(running, 99), "max": max(running)},
                    "post_response_s": {"p50": median([j["post_response_s"] for j in jobs]),
                                        "p99": pct([j["post_response_s"] for j in jobs], 99)}},
    }
