"""Checkpoints with sizes; downloads of consolidated weights; nothing outside the runs directory."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi.testclient import TestClient

from jobs.settings import Settings
from tests.api.conftest import finish_job, ingest, mlp_spec, start_job


def _checkpoint(run_dir: Path, step: int, weights: bytes | None = None) -> dict:
    d = run_dir / "checkpoints" / f"step_{step:08d}"
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x" * 1000)
    (d / ".metadata").write_bytes(b"m" * 24)
    event = {"type": "checkpoint", "step": step, "epoch": 0, "path": f"checkpoints/step_{step:08d}"}
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
        event["weights"] = f"checkpoints/step_{step:08d}/model.safetensors"
    return event


def test_checkpoints_list_sizes_and_weights_download(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    assert client.get(f"/v1/jobs/{job['id']}/weights").status_code == 404
    run_dir = start_job(settings, job["id"])
    events = [_checkpoint(run_dir, 10), _checkpoint(run_dir, 20, weights=b"W" * 3000)]
    gone = {"type": "checkpoint", "step": 5, "epoch": 0, "path": "checkpoints/step_00000005"}  # deleted by keep_last
    ingest(settings, job["id"], [{**e, "seq": i + 1, "time": 100.0 + i} for i, e in enumerate([gone, *events])])
    finish_job(settings, job["id"])

    items = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert [(c["step"], c["available"], c["size_bytes"]) for c in items] == [(5, False, None), (10, True, 1024), (20, True, 4024)]
    assert items[2]["path"] == f"{run_dir}/checkpoints/step_00000020"
    assert items[1]["weights_url"] is None
    assert items[2]["weights_url"] == f"/v1/jobs/{job['id']}/checkpoints/20/weights"

    final = client.get(f"/v1/jobs/{job['id']}/weights")
    assert final.status_code == 200 and final.content == b"W" * 3000
    assert final.headers["content-type"] == "application/octet-stream"
    assert f"{job['id']}-step20-model.safetensors" in final.headers["content-disposition"]
    assert client.get(items[2]["weights_url"]).content == b"W" * 3000
    assert client.get(f"/v1/jobs/{job['id']}/checkpoints/10/weights").status_code == 404  # no consolidated file there
    assert client.get(f"/v1/jobs/{job['id']}/checkpoints/99/weights").status_code == 404
    ranged = client.get(items[2]["weights_url"], headers={"Range": "bytes=0-9"})
    assert ranged.status_code == 206 and ranged.content == b"W" * 10


def test_paths_outside_the_runs_directory_are_never_served(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"secret")
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    run_dir = start_job(settings, job["id"])
    link = run_dir / "checkpoints" / "step_00000003"
    link.mkdir(parents=True)
    os.symlink(secret, link / "model.safetensors")
    ingest(settings, job["id"], [
        {"seq": 1, "time": 1.0, "type": "checkpoint", "step": 1, "path": "../../../../etc", "weights": "../../../../etc/passwd"},
        {"seq": 2, "time": 2.0, "type": "checkpoint", "step": 2, "path": "/etc", "weights": "/etc/passwd"},
        {"seq": 3, "time": 3.0, "type": "checkpoint", "step": 3, "path": "checkpoints/step_00000003",
         "weights": "checkpoints/step_00000003/model.safetensors"},
    ])
    finish_job(settings, job["id"])
    items = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert [(c["step"], c["size_bytes"]) for c in items] == [(1, None), (2, None), (3, 0)]  # the symlink is not followed
    for step in (1, 2, 3):
        resp = client.get(f"/v1/jobs/{job['id']}/checkpoints/{step}/weights")
        assert resp.status_code == 404 and b"secret" not in resp.content and b"root:" not in resp.content
    assert client.get(f"/v1/jobs/{job['id']}/weights").status_code == 404
