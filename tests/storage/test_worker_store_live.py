"""A worker with TORCHYARD_STORAGE_URL: a job's checkpoints (manifest last), events and logs end up in a real S3
server before the job is marked succeeded."""

from __future__ import annotations

import pytest

from jobs.storage import checkpoints as stored
from jobs.storage.manifest import MANIFEST_NAME
from jobs.storage.store import ObjectStore
from jobs.storage.url import parse
from tests.helpers import Services
from tests.object_store import SeaweedS3

pytestmark = pytest.mark.slow

SPEC = {
    "name": "mlp-store",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 256, "eval_samples": 64, "features": 8, "classes": 2}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 2, "global_batch_size": 64, "lr": 0.01, "log_every_steps": 2},
    "checkpoint": {"every_steps": 4, "keep_last": 2},
}


def test_a_jobs_checkpoints_events_and_logs_are_in_the_store_when_it_succeeds(services: Services, s3: SeaweedS3) -> None:
    settings = services.settings
    store_env = {"TORCHYARD_STORAGE_URL": settings.storage_url or "", "TORCHYARD_S3_ENDPOINT_URL": s3.endpoint,
                 "TORCHYARD_STORAGE_SYNC_INTERVAL_S": "1"}
    services.start_api(**store_env)
    services.start_worker(**store_env)
    with services.client() as client:
        created = client.post("/v1/jobs", json=SPEC)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=300)
        assert job["status"] == "succeeded", job["error"]

    store = ObjectStore(parse(settings.storage_url or ""), s3.endpoint)
    listing = store.list(stored.job_key(job_id))
    run_dir = settings.runs_dir / job_id
    # Every checkpoint the job committed, each with its manifest; the last one (step 8) with the final weights.
    assert f"checkpoints/step_00000008/{MANIFEST_NAME}" in listing
    assert f"checkpoints/step_00000004/{MANIFEST_NAME}" in listing
    assert "checkpoints/step_00000008/model.safetensors" in listing
    newest = stored.newest_stored(store, job_id)
    assert newest is not None and newest.step == 8
    # The events file and the logs as they were when the job ended.
    assert listing["events.jsonl"] == (run_dir / "events.jsonl").stat().st_size
    assert listing["logs/attempt-1/launcher.log"] == (run_dir / "logs" / "attempt-1" / "launcher.log").stat().st_size
    assert any(key.startswith("logs/attempt-1/") and key.endswith("ranks.log") for key in listing)
