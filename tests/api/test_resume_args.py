"""resume_args, checkpoint.discover and metrics.from_output at submission (a malformed template or an escaping
glob is a 422 naming the field, and nothing is created), and a found directory checkpoint downloaded as a tar."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.ingest_found import FOUND_BASE, FoundCheckpoint, ingest_found
from jobs.store.models import Job


@pytest.mark.parametrize(("change", "field"), [
    ({"resume_args": ["--ckpt_path", "{ckpt}"]}, "resume_args.1"),
    ({"resume_args": ["--ckpt_path={checkpoint"]}, "resume_args.0"),
    ({"checkpoint": {"discover": ["../other/*.pt"]}}, "checkpoint.discover.0"),
    ({"checkpoint": {"discover": ["/etc/*"]}}, "checkpoint.discover.0"),
    ({"metrics": {"from_output": ["iter {step}: loss {loss}", "loss {loss} avg {loss}"]}}, "metrics.from_output.1"),
    ({"metrics": {"from_output": ["iter {step}: loss {loss"]}}, "metrics.from_output.0"),
])
def test_malformed_resume_args_or_discover_is_422_naming_the_field(client: TestClient, settings: Settings, change: dict,
                                                                    field: str) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    spec = {"kind": "script", "name": "lit", "entrypoint": "train.py", **change}
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert [e["field"] for e in body["errors"]] == [field]
    assert client.get("/v1/jobs").json()["items"] == []


def test_a_well_formed_spec_is_accepted_as_written(client: TestClient, settings: Settings) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    spec = {"kind": "script", "name": "lit", "entrypoint": "train.py", "resume_args": ["--ckpt_path", "{checkpoint}"],
            "checkpoint": {"discover": ["out/*.pt"]}, "env": {"ACCELERATE_MIXED_PRECISION": "no"}}
    resp = client.post("/v1/jobs", json=spec)
    assert resp.status_code == 201, resp.text
    stored = resp.json()["spec"]
    assert stored["resume_args"] == ["--ckpt_path", "{checkpoint}"] and stored["checkpoint"] == {"discover": ["out/*.pt"]}


def test_a_directory_checkpoint_downloads_as_a_tar_without_following_links(client: TestClient, settings: Settings,
                                                                           tmp_path: Path) -> None:
    (settings.code_dir / "train.py").write_text("pass\n")
    job = client.post("/v1/jobs", json={"kind": "script", "name": "hf", "entrypoint": "train.py"}).json()
    run_dir = settings.runs_dir / job["id"]
    ckpt = run_dir / "out" / "checkpoint-30"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"w" * 1000)
    (ckpt / "trainer_state.json").write_text('{"global_step": 30}')
    (tmp_path / "secret").write_text("not yours")
    (ckpt / "leak").symlink_to(tmp_path / "secret")
    with Session(get_engine(settings.database_url)) as session:
        session.exec(sa.update(Job).where(Job.id == job["id"]).values(run_dir=str(run_dir)))
        session.commit()
        ingest_found(session, job["id"], FOUND_BASE, [], [FoundCheckpoint(30, "out/checkpoint-30", 1.0, {"found": "huggingface"})])
    resp = client.get(f"/v1/jobs/{job['id']}/checkpoints/30/archive")
    assert resp.status_code == 200, resp.text
    assert "checkpoint-30.tar" in resp.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tar:
        assert sorted(tar.getnames()) == ["checkpoint-30/model.safetensors", "checkpoint-30/trainer_state.json"]
        assert tar.extractfile("checkpoint-30/model.safetensors").read() == b"w" * 1000  # type: ignore[union-attr]
    missing = client.get(f"/v1/jobs/{job['id']}/checkpoints/31/archive")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("application/problem+json")
