"""Chaos tests: real redis-server, real workers, real torchrun, with faults injected.

Leases are short here (3 s) so lost workers are noticed quickly; the trainer's fault hook
(trainer/faults.py, TORCHYARD_FAULTS in a worker's environment) makes ranks raise, hang or crawl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from jobs.store.models import Attempt
from tests.conftest import make_settings
from worker.sandbox.processes import marked_processes


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    s = make_settings(tmp_path, database_url, redis_url, lease_ttl_s=3.0, stop_grace_s=8.0)
    init_db(get_engine(s.database_url))
    return s


def spec(steps: int = 40, ranks: int = 1, **overrides: Any) -> dict[str, Any]:
    """A job of ``ranks`` ranks and ``steps`` optimizer steps, every step logged, a checkpoint every 5. A test of
    the service (leases, requeues, fencing, stops) needs one rank: each rank more is an interpreter importing torch
    (5 CPU-s). Two where one rank's fault must reach the others, or where the world size is what is checked."""
    body: dict[str, Any] = {
        "name": "chaos",
        "model": {"name": "mlp", "args": {"hidden": 16}},
        "data": {"name": "synthetic-classification", "args": {"samples": steps * 32, "eval_samples": 64, "features": 8, "classes": 3}},
        "parallel": {"strategy": "ddp", "nproc_per_node": ranks},
        "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 1},
        "checkpoint": {"every_steps": 5},
    }
    body.update(overrides)
    return body


def faults(*items: dict[str, Any]) -> dict[str, str]:
    return {"TORCHYARD_FAULTS": json.dumps(list(items))}


def slow(seconds: float = 0.15, attempt: int | None = None) -> dict[str, Any]:
    return {"action": "slow", "step": 1, "seconds": seconds, "restart": None, "attempt": attempt}


def loss_steps(client: httpx.Client, job_id: str) -> list[int]:
    items = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss", "limit": 10000}).json()["items"]
    return [m["step"] for m in items]


def assert_nothing_lost(client: httpx.Client, job: dict[str, Any], steps: int) -> None:
    """Finished, every step's loss there exactly once, no process of the job left."""
    assert job["status"] == "succeeded", job["error"]
    assert loss_steps(client, job["id"]) == list(range(1, steps + 1))
    assert job["last_step"] == steps
    assert marked_processes(job["id"]) == []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running: a zombie has ended, its parent just has not reaped it yet."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def attempts(settings: Settings, job_id: str) -> list[Attempt]:
    with Session(get_engine(settings.database_url)) as session:
        query = sa.select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)
        return list(session.exec(query).scalars())  # type: ignore[call-overload]


def wait_step(services: Any, client: httpx.Client, job_id: str, step: int, timeout_s: float = 120) -> dict[str, Any]:
    from tests.helpers import wait_until

    def reached() -> dict[str, Any] | None:
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if (job["last_step"] or 0) >= step else None

    return wait_until(reached, timeout_s, what=f"job {job_id} to reach step {step}")
