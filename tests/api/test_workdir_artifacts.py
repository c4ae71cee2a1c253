"""Files a script job wrote or changed in its working directory are its artifacts (``workdir/<path>``), listed and
downloaded through /v1/jobs/{id}/artifacts with the same path safety as artifacts/; the files it was uploaded
with, Python's bytecode cache, links and hard links are neither listed nor served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jobs.settings import Settings
from jobspec.spec import ScriptJobSpec
from tests.api.conftest import key_headers, mlp_spec, start_job
from tests.worker.test_workdir import DIGEST, bundle_run
from worker import workdir


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_what_the_job_wrote_in_its_working_directory_is_listed_and_downloadable(
        client: TestClient, settings: Settings, tmp_path: Path) -> None:
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    job_id = client.post("/v1/jobs", json=mlp_spec(), headers=alice).json()["id"]
    run_dir = start_job(settings, job_id)
    bundle_run(settings, job_id)
    copy = workdir.make(settings, ScriptJobSpec(kind="script", name="s", entrypoint="train.py", code=DIGEST), run_dir)
    # What a framework leaves beside the code, a config the script rewrote, and what must stay unlisted.
    (copy / "outputs" / "checkpoint-4").mkdir(parents=True)
    (copy / "outputs" / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    (copy / "config" / "base.yaml").write_text("lr: 0.5\n")
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\x00pyc")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    os.symlink(secret, copy / "leak.txt")
    os.link(secret, copy / "hardlink.txt")
    (run_dir / "artifacts").mkdir()
    (run_dir / "artifacts" / "notes.txt").write_text("artifact")

    listed = client.get(f"/v1/jobs/{job_id}/artifacts", headers=alice)
    assert listed.status_code == 200, listed.text
    assert [i["path"] for i in listed.json()["items"]] == [
        "notes.txt", "workdir/config/base.yaml", "workdir/outputs/checkpoint-4/trainer_state.json"]
    got = client.get(f"/v1/jobs/{job_id}/artifacts/workdir/outputs/checkpoint-4/trainer_state.json", headers=alice)
    assert (got.status_code, got.text) == (200, '{"global_step": 4}')
    assert client.get(f"/v1/jobs/{job_id}/artifacts/workdir/config/base.yaml", headers=alice).text == "lr: 0.5\n"

    for refused in ("workdir/train.py", "workdir/__pycache__/train.cpython-311.pyc", "workdir/leak.txt",
                    "workdir/hardlink.txt", "workdir/../spec.json", "workdir/../../secret.txt", "workdir/", "workdir"):
        resp = client.get(f"/v1/jobs/{job_id}/artifacts/{refused}", headers=alice)
        # 405: the client resolved the '..' itself and asked for another route; test_artifacts.py sends them raw.
        assert resp.status_code in (404, 405) and b"TOP SECRET" not in resp.content, (refused, resp.status_code)
    assert client.get(f"/v1/jobs/{job_id}/artifacts", headers=bob).status_code == 404  # owner only
    assert client.get(f"/v1/jobs/{job_id}/artifacts/workdir/config/base.yaml", headers=bob).status_code == 404

    # A garbled record of the upload hides nothing the job wrote: every file then counts as the job's.
    (run_dir / "workdir.json").write_text("not json")
    paths = [i["path"] for i in client.get(f"/v1/jobs/{job_id}/artifacts", headers=alice).json()["items"]]
    assert "workdir/train.py" in paths and "workdir/leak.txt" not in paths
