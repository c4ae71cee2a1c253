from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.ingest import ingest_events
from jobs.store.models import Attempt, Status, utcnow
from jobs.store.states import transition
from tests.helpers import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, headers=ADMIN) as c:
        yield c


def key_headers(client: TestClient, owner: str) -> dict[str, str]:
    """Authorization headers of a fresh API key for ``owner``, made by the admin."""
    resp = client.post("/v1/keys", json={"owner": owner, "name": f"{owner} test key"}, headers=ADMIN)
    assert resp.status_code == 201, resp.text
    return {"Authorization": f"Bearer {resp.json()['key']}"}


def mlp_spec(**overrides: object) -> dict:
    spec: dict = {
        "name": "mlp-test",
        "model": {"name": "mlp", "args": {"hidden": 16}},
        "data": {"name": "synthetic-classification", "args": {"samples": 256}},
        "parallel": {"strategy": "ddp", "nproc_per_node": 2},
        "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01},
    }
    spec.update(overrides)
    return spec


# ------------------------------------------------------------ what a worker would do, done directly


def session_of(settings: Settings) -> Session:
    return Session(get_engine(settings.database_url), expire_on_commit=False)


def start_job(settings: Settings, job_id: str, worker: str = "worker-a") -> Path:
    """queued -> running as a supervisor claims it; returns the run directory."""
    run_dir = (settings.runs_dir / job_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    with session_of(settings) as s:
        job = transition(s, job_id, Status.RUNNING, expect=[Status.QUEUED], reason=f"started on {worker}",
                         values={"worker_id": worker, "run_dir": str(run_dir), "started_at": utcnow()})
        s.merge(Attempt(job_id=job_id, attempt=job.attempt, worker_id=worker))
        s.commit()
    return run_dir


def finish_job(settings: Settings, job_id: str, to: Status = Status.SUCCEEDED, reason: str = "torchrun exited 0") -> None:
    with session_of(settings) as s:
        job = transition(s, job_id, to, reason=reason)
        row = s.get(Attempt, (job_id, job.attempt))
        if row is not None:
            row.finished_at, row.outcome = utcnow(), to.value
            s.add(row)
            s.commit()


def ingest(settings: Settings, job_id: str, events: list[dict[str, Any]]) -> None:
    with session_of(settings) as s:
        ingest_events(s, job_id, events)


def metric_event(seq: int, step: int, **values: float) -> dict[str, Any]:
    return {"seq": seq, "time": 1_700_000_000.0 + seq, "type": "metric", "step": step, "epoch": 0,
            "values": values or {"train/loss": 1.0 / seq}}
