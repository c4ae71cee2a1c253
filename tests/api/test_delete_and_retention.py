"""Disk use does not only grow: a finished job can be deleted, and old run directories expire."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from jobs.lifecycle.retention import expire_run_dirs
from jobs.settings import Settings
from jobs.store.models import Job, MetricPoint, Status, utcnow
from tests.api.conftest import finish_job, ingest, key_headers, metric_event, mlp_spec, session_of, start_job


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def _finished_job(client: TestClient, settings: Settings, days_ago: float = 0.0) -> tuple[str, Path]:
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    run_dir = start_job(settings, job_id)
    (run_dir / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000002" / "shard.distcp").write_bytes(b"x" * 100)
    (run_dir / "checkpoints" / "step_00000004").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_00000004" / "model.safetensors").write_bytes(b"w" * 100)
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "launcher.log").write_text("log")
    ingest(settings, job_id, [metric_event(1, 2), {
        "seq": 2, "time": 1.0, "type": "checkpoint", "step": 4, "epoch": 0, "path": "checkpoints/step_00000004",
        "weights": "checkpoints/step_00000004/model.safetensors"}])
    finish_job(settings, job_id)
    with session_of(settings) as s:
        s.exec(sa.update(Job).where(Job.id == job_id).values(finished_at=utcnow() - timedelta(days=days_ago)))
        s.commit()
    return job_id, run_dir


def test_delete_removes_a_finished_jobs_rows_and_run_directory(client: TestClient, settings: Settings) -> None:
    job_id, run_dir = _finished_job(client, settings)
    other = key_headers(client, "mallory")
    assert client.delete(f"/v1/jobs/{job_id}", headers=other).status_code == 404  # another owner's job: not there
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert client.get(f"/v1/jobs/{job_id}").status_code == 404
    assert not run_dir.exists()
    with session_of(settings) as s:
        assert s.exec(sa.select(sa.func.count()).select_from(MetricPoint).where(MetricPoint.job_id == job_id)).scalar_one() == 0
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 404


def test_delete_of_a_queued_or_running_job_is_refused_and_changes_nothing(client: TestClient, settings: Settings) -> None:
    queued = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    assert client.delete(f"/v1/jobs/{queued}").status_code == 409
    running = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    run_dir = start_job(settings, running)
    resp = client.delete(f"/v1/jobs/{running}")
    assert resp.status_code == 409 and "running" in resp.text
    assert client.get(f"/v1/jobs/{queued}").json()["status"] == Status.QUEUED.value
    assert client.get(f"/v1/jobs/{running}").json()["status"] == Status.RUNNING.value
    assert run_dir.exists()


def test_retention_expires_old_run_directories_keeping_final_weights_when_asked(client: TestClient, settings: Settings) -> None:
    old, old_dir = _finished_job(client, settings, days_ago=10)
    recent, recent_dir = _finished_job(client, settings, days_ago=1)
    with session_of(settings) as s:
        assert expire_run_dirs(s, settings) == []  # no retention set: nothing expires
        keeping = settings.model_copy(update={"run_retention_days": 7, "run_retention_keep_weights": True})
        assert expire_run_dirs(s, keeping) == [old]
    kept = sorted(p.relative_to(old_dir) for p in old_dir.rglob("*") if p.is_file())
    assert [str(p) for p in kept] == ["checkpoints/step_00000004/model.safetensors"]
    assert client.get(f"/v1/jobs/{old}/weights").status_code == 200  # still served
    assert (recent_dir / "logs" / "launcher.log").exists()
    with session_of(settings) as s:
        assert expire_run_dirs(s, settings.model_copy(update={"run_retention_days": 7})) == [old]
    assert not old_dir.exists()
    assert client.get(f"/v1/jobs/{old}").json()["status"] == "succeeded"  # the record stays
