"""What an earlier attempt's rank 0 wrote and its supervisor never stored (the lease watchdog killed the attempt
while the database hung, or the worker died) is stored by the next attempt as it is adopted, before anything else:
even an attempt that ends before its ranks start loses none of it."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from jobs.infra import queue
from jobs.store.db import get_engine, init_db
from jobs.store.models import Attempt, Job, Status
from jobs.store.states import transition
from tests.api.conftest import ADMIN, metric_event, mlp_spec
from tests.conftest import make_settings
from torchyard.events import EVENTS_FILE
from worker.supervisor import Supervisor


def test_the_next_attempt_stores_what_the_last_one_left_unread_even_if_it_never_launches(
        tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url, redis_url, worker_id="host-a")
    engine = get_engine(settings.database_url)
    init_db(engine)
    # One rank per GPU on a worker without one: this attempt ends at placement, before any rank starts.
    with TestClient(create_app(settings), headers=ADMIN) as client:
        resp = client.post("/v1/jobs", json=mlp_spec(parallel={"strategy": "ddp", "nproc_per_node": "gpu"}))
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
    run_dir = settings.runs_dir / job_id
    run_dir.mkdir(parents=True)
    # The earlier attempt's rank 0 wrote steps 1-3; its supervisor stored step 1 only before it was killed.
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps(metric_event(s, s)) + "\n" for s in (1, 2, 3)))
    with Session(engine, expire_on_commit=False) as s:
        s.exec(Job.__table__.update().where(Job.id == job_id).values(attempt=2, last_seq=1, last_step=1))  # type: ignore[attr-defined]
        s.commit()
        transition(s, job_id, Status.RUNNING, expect=[Status.QUEUED], reason="placed on host-a",
                   values={"worker_id": "host-a", "run_dir": str(run_dir.resolve())})
        s.merge(Attempt(job_id=job_id, attempt=2, worker_id=None))
        s.commit()

    verdict = Supervisor(job_id, 2, settings, engine, queue.redis_client(settings.redis_url)).run()

    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        assert job.status == Status.FAILED.value and "has no GPU" in (job.error_message or ""), verdict
        assert (job.last_seq, job.last_step) == (3, 3), "steps an earlier attempt wrote were never stored"
