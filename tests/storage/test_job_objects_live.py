"""A job's objects in the store go with it: DELETE /v1/jobs/{id} removes them, retention expires them (keeping the
final weights when asked), and another job's objects stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from jobs.lifecycle.retention import expire_run_dirs
from jobs.settings import Settings
from jobs.storage.checkpoints import job_key
from jobs.storage.store import ObjectStore
from jobs.storage.url import parse
from jobs.store.models import Job, utcnow
from tests.api.conftest import finish_job, ingest, mlp_spec, session_of, start_job

pytestmark = pytest.mark.slow

WEIGHTS = "checkpoints/step_00000004/model.safetensors"





def _finished_job_in_store(client: TestClient, settings: Settings, days_ago: float = 0.0) -> str:
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    start_job(settings, job_id)
    ingest(settings, job_id, [{"seq": 1, "time": 1.0, "type": "checkpoint", "step": 4, "epoch": 0,
                               "path": "checkpoints/step_00000004", "weights": WEIGHTS}])
    finish_job(settings, job_id)
    with session_of(settings) as s:
        s.exec(sa.update(Job).where(Job.id == job_id).values(finished_at=utcnow() - timedelta(days=days_ago)))
        s.commit()
    store = _store(settings)
    for relative in (WEIGHTS, "checkpoints/step_00000004/__0_0.distcp", "events.jsonl", "logs/attempt-1/launcher.log"):
        store.put_bytes(job_key(job_id, relative), b"x")
    return job_id


def _store(settings: Settings) -> ObjectStore:
    return ObjectStore(parse(settings.storage_url or ""), settings.s3_endpoint_url)


def test_delete_removes_the_jobs_objects_and_no_others(client: TestClient, settings: Settings) -> None:
    gone, kept = _finished_job_in_store(client, settings), _finished_job_in_store(client, settings)
    assert client.delete(f"/v1/jobs/{gone}").status_code == 204
    store = _store(settings)
    assert store.list(job_key(gone)) == {}
    assert len(store.list(job_key(kept))) == 4


def test_retention_expires_the_objects_keeping_the_final_weights_when_asked(client: TestClient, settings: Settings) -> None:
    old, recent = _finished_job_in_store(client, settings, days_ago=10), _finished_job_in_store(client, settings, days_ago=1)
    with session_of(settings) as s:
        expire_run_dirs(s, settings.model_copy(update={"run_retention_days": 7, "run_retention_keep_weights": True}))
    store = _store(settings)
    assert store.list(job_key(old)) == {WEIGHTS: 1}
    assert len(store.list(job_key(recent))) == 4
