"""With TORCHYARD_STORAGE_URL the API serves a job's weights and artifacts from the store, whole or by Range, and its
directory checkpoints as tar archives once complete there, though its own runs directory holds nothing of the job; a
store that does not answer is a 503 that names no credential."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jobs.settings import Settings
from jobs.storage.checkpoints import job_key, upload_checkpoint
from jobs.storage.store import ObjectStore
from jobs.storage.url import parse
from tests.api.conftest import finish_job, ingest, mlp_spec, start_job
from tests.object_store import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slow

WEIGHTS = "checkpoints/step_00000004/model.safetensors"





def _job_in_store_only(client: TestClient, settings: Settings, files: dict[str, bytes]) -> str:
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    run_dir = start_job(settings, job_id)
    ingest(settings, job_id, [{"seq": 1, "time": 1.0, "type": "checkpoint", "step": 4, "epoch": 0,
                               "path": "checkpoints/step_00000004", "weights": WEIGHTS}])
    finish_job(settings, job_id)
    store = ObjectStore(parse(settings.storage_url or ""), settings.s3_endpoint_url)
    for relative, data in files.items():
        store.put_bytes(job_key(job_id, relative), data)
    assert not any(p.is_file() for p in run_dir.rglob("*"))  # the API's runs directory has none of it
    return job_id


def test_weights_and_artifacts_come_from_the_store_whole_and_by_range(client: TestClient, settings: Settings) -> None:
    weights, report = os.urandom(20 * 1024 * 1024 + 3), b"accuracy 0.93\n"
    job_id = _job_in_store_only(client, settings, {WEIGHTS: weights, "artifacts/eval/report.txt": report})

    whole = client.get(f"/v1/jobs/{job_id}/weights")
    assert whole.status_code == 200 and whole.content == weights
    part = client.get(f"/v1/jobs/{job_id}/checkpoints/4/weights", headers={"Range": "bytes=1000-1999"})
    assert part.status_code == 206 and part.content == weights[1000:2000]
    assert part.headers["Content-Range"] == f"bytes 1000-1999/{len(weights)}"
    tail = client.get(f"/v1/jobs/{job_id}/weights", headers={"Range": "bytes=-10"})
    assert tail.status_code == 206 and tail.content == weights[-10:]
    assert client.get(f"/v1/jobs/{job_id}/weights", headers={"Range": f"bytes={len(weights)}-"}).status_code == 416

    listed = client.get(f"/v1/jobs/{job_id}/artifacts").json()
    assert [(a["path"], a["size_bytes"]) for a in listed["items"]] == [("eval/report.txt", len(report))]
    assert client.get(f"/v1/jobs/{job_id}/artifacts/eval/report.txt").content == report
    ranged = client.get(f"/v1/jobs/{job_id}/artifacts/eval/report.txt", headers={"Range": "bytes=9-12"})
    assert ranged.status_code == 206 and ranged.content == b"0.93"
    assert client.get(f"/v1/jobs/{job_id}/artifacts/eval/missing.txt").status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/artifacts/..%2F..%2Fevents.jsonl").status_code == 404


def test_a_store_that_does_not_answer_is_a_503_naming_no_credential(client: TestClient, settings: Settings, s3: SeaweedS3) -> None:
    job_id = _job_in_store_only(client, settings, {WEIGHTS: b"w"})
    s3.stop()
    try:
        answer = client.get(f"/v1/jobs/{job_id}/artifacts")
    finally:
        s3.start()
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    assert SECRET_KEY not in answer.text and ACCESS_KEY not in answer.text
    assert client.get(f"/v1/jobs/{job_id}/weights").content == b"w"


def test_a_checkpoint_archive_comes_from_the_store_once_complete(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    start_job(settings, job_id)
    host = tmp_path / "host" / job_id / "checkpoints"  # a worker's run directory, not the API's
    files = {"model.safetensors": os.urandom(3 * 1024 * 1024 + 5), "meta.json": b'{"step": 4}', "optim/rank0.pt": b"o" * 700}
    for step in (4, 8):
        for relative, data in files.items():
            (host / f"step_{step:08d}" / relative).parent.mkdir(parents=True, exist_ok=True)
            (host / f"step_{step:08d}" / relative).write_bytes(data)
    ingest(settings, job_id, [{"seq": s // 4, "time": 1.0, "type": "checkpoint", "step": s, "epoch": 0,
                               "path": f"checkpoints/step_{s:08d}"} for s in (4, 8, 12)])
    finish_job(settings, job_id)
    store = ObjectStore(parse(settings.storage_url or ""), settings.s3_endpoint_url)
    upload_checkpoint(store, job_id, host / "step_00000004")
    # Step 8: its manifest went up, then one of its files went missing; step 12 never went up.
    upload_checkpoint(store, job_id, host / "step_00000008")
    store.delete_prefix(job_key(job_id, "checkpoints/step_00000008/optim"))
    assert not any(p.is_file() for p in settings.runs_dir.rglob("*"))

    whole = client.get(f"/v1/jobs/{job_id}/checkpoints/4/archive")
    assert whole.status_code == 200, whole.text
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == {f"step_00000004/{relative}": data for relative, data in files.items()}  # no manifest among them
    for step in (8, 12):
        refused = client.get(f"/v1/jobs/{job_id}/checkpoints/{step}/archive")
        assert refused.status_code == 404 and "not complete in the object store" in refused.json()["detail"]
