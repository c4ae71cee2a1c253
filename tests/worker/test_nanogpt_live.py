"""A nanoGPT-shaped repository submitted unchanged with --workdir: it writes ``out/ckpt.pt`` (a dict holding
``iter_num``) relative to where it runs, resumes with ``--init_from=resume``, and prints nanoGPT's ``iter N: loss
...`` line, whose numbers ``metrics.from_output`` names. With ``checkpoint: {discover:
["out/*.pt"]}`` its checkpoint is listed at the script's own step, and after the worker is SIGKILLed mid-run
the next attempt gets its resume_args and trains every step once. A resume that finds no checkpoint says so
on the attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from tests.worker.frameworks import NANOGPT_TRAIN as TRAIN
from tests.worker.frameworks import checkpoints, killed_and_resumed_logs
from torchyard import Client

pytestmark = pytest.mark.slow



@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_nanogpt_layout_resumes_from_its_own_checkpoint_after_a_worker_kill(services: Services, tmp_path: Path) -> None:
    repo = tmp_path / "nanogpt"
    repo.mkdir()
    (repo / "train.py").write_text(TRAIN)
    services.start_api()
    first = services.start_worker()
    with Client(services.url, services.headers["Authorization"].removeprefix("Bearer ")) as sdk:
        code = sdk.upload_code(repo).digest
    spec = {"kind": "script", "name": "nano", "entrypoint": "train.py", "code": code, "resume_args": ["--init_from=resume"],
            "checkpoint": {"discover": ["out/*.pt"]},
            "metrics": {"from_output": ["iter {step}: loss {train/loss}, time {time_ms}ms, mfu {mfu}%"]}}
    with services.client() as client:
        created = client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        # Listed at the step inside the file (it names none), so a kill after it resumes from there.
        wait_until(lambda: any(c["step"] >= 10 for c in checkpoints(client, job_id)), 180, what="out/ckpt.pt at iter 10")
        assert all(c["path"].endswith(f"{job_id}/workdir/out/ckpt.pt") for c in checkpoints(client, job_id))
        services.kill_worker(first)
        services.start_worker()
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=300)
        assert job["status"] == "succeeded", job["error"]
        assert_resumed_after_a_kill(job)
        killed, resumed = killed_and_resumed_logs(job)
        assert "starting at iter 0 (init_from=scratch)" in killed
        start = job["attempts"][-1]["resumed_from_step"]
        assert start is not None and start >= 10 and f"starting at iter {start} (init_from=resume)" in resumed
        assert job["attempts"][-1]["note"] is None
        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["items"]
        assert [p["step"] for p in points] == list(range(1, 41))  # every step once
        assert [c["step"] for c in checkpoints(client, job_id)][-1] == 40
        # What it only prints, named by the spec's template: every step once, across the kill, as printed.
        printed = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss", "limit": 1000}).json()["items"]
        assert [(p["step"], p["value"]) for p in printed] == [(s, round(1.0 / s, 4)) for s in range(1, 41)]
        mfu = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "mfu", "limit": 1000}).json()["items"]
        assert {p["value"] for p in mfu} == {-100.0} and len(mfu) == 40

        # A retry that finds no checkpoint runs without its resume_args and says so on the attempt.
        created = client.post("/v1/jobs", json={**spec, "name": "nano-fails", "retries": 1, "env": {"APP_FAIL_FIRST": "1"}})
        assert created.status_code == 201, created.text
        job = services.wait_status(client, created.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=300)
        assert job["status"] == "succeeded", job["error"]
        assert [a["note"] for a in job["attempts"]] == [
            None, "resume_args not applied: no checkpoint found under out/*.pt"]
