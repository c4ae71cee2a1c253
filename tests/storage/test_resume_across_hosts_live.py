"""Two hosts that share no directory, only the object store: a job's worker is SIGKILLed mid-run (its whole process
tree, as a host that dies); the job resumes on the other worker from the checkpoint in the store, every step's loss
stored once, and the API, whose own runs directory holds nothing, serves the logs of both attempts.

The same for a script job from an unchanged nanoGPT-shaped repository: its code reaches each host from the store, its
own checkpoint (``out/ckpt.pt``, which it overwrites at each save) goes up as it saves, the other host downloads it and
the script resumes from it through ``resume_args``, and what it wrote in its working directory downloads through the
API."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from jobs.settings import Settings
from jobs.storage import checkpoints as stored
from jobs.storage import found_checkpoints
from jobs.storage.store import ObjectStore
from jobs.storage.url import parse
from jobs.store.db import get_engine, init_db
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec
from tests.conftest import make_settings
from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from tests.object_store import SeaweedS3
from tests.worker.frameworks import NANOGPT_TRAIN, checkpoints, rank_logs
from torchyard import Client
from worker.sandbox.processes import marked_processes

pytestmark = pytest.mark.slow

STEPS = 16
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str, s3: SeaweedS3, request: pytest.FixtureRequest) -> Settings:
    """The store's settings with short leases, so the dead host's job is requeued within seconds. Not 3 s: on a loaded
    machine the living host's final upload and ingest outlasted that three times and the job failed as lost."""
    s = make_settings(tmp_path, database_url, redis_url, storage_url=f"s3://{s3.bucket}/svc-{request.node.name[:40]}",
                      s3_endpoint_url=s3.endpoint, lease_ttl_s=10.0, stop_grace_s=8.0)
    init_db(get_engine(s.database_url))
    return s


def _hosts(services: Services, settings: Settings, s3: SeaweedS3, tmp_path: Path) -> tuple[dict[str, str], Path, Path, ObjectStore]:
    """The store's environment for the API and both hosts, each host's own runs directory (its bundles directory
    inside), the store as the test reads it; the API started."""
    store_env = {"TORCHYARD_STORAGE_URL": settings.storage_url or "", "TORCHYARD_S3_ENDPOINT_URL": s3.endpoint,
                 "TORCHYARD_STORAGE_SYNC_INTERVAL_S": "1"}
    services.start_api(**store_env)  # its runs directory (settings.runs_dir) is neither host's
    return store_env, tmp_path / "host-a-runs", tmp_path / "host-b-runs", ObjectStore(parse(settings.storage_url or ""), s3.endpoint)


def _host_dies_once(services: Services, doomed: subprocess.Popen[bytes], job_id: str, saved: Callable[[], bool],
                    host_b: Path, store_env: dict[str, str]) -> None:
    """Once ``saved`` says the store holds a checkpoint, host A dies with its whole process tree and host B starts."""
    wait_until(saved, 240, interval_s=0.5, what="a complete checkpoint of host A in the store")
    services.kill_worker(doomed, whole=True)
    wait_until(lambda: marked_processes(job_id) == [], 10, what="the job's processes to die with their host")
    services.start_worker("host-b", TORCHYARD_RUNS_DIR=str(host_b), **store_env)


def test_a_job_whose_host_dies_resumes_on_another_from_the_store(services: Services, settings: Settings, s3: SeaweedS3,
                                                                 tmp_path: Path) -> None:
    store_env, host_a, host_b, store = _hosts(services, settings, s3, tmp_path)
    # 1 s a step on host A: 12 s of the job are left once its step-4 checkpoint is in the store (0.3 s left 3.6 s,
    # less than a loaded machine's upload and poll), so host A dies mid-job.
    doomed = services.start_worker("host-a", TORCHYARD_RUNS_DIR=str(host_a), **store_env, **faults(slow(1.0)))
    one_rank = spec(STEPS, checkpoint={"every_steps": 4}, parallel={"strategy": "ddp", "nproc_per_node": 1})
    with services.client() as client:
        created = client.post("/v1/jobs", json=one_rank)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]

        def checkpoint_in_store() -> bool:
            newest = stored.newest_stored(store, job_id)
            return newest is not None and (newest.step or 0) >= 4

        _host_dies_once(services, doomed, job_id, checkpoint_in_store, host_b, store_env)
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=300)
        assert_nothing_lost(client, job, STEPS)
        assert_resumed_after_a_kill(job)
        tries = attempts(settings, job_id)
        assert tries[-1].resumed_from_step is not None and tries[-1].resumed_from_step >= 4  # from the store's checkpoint
        first, last = tries[0].attempt, tries[-1].attempt

        # Host B never saw host A's run directory, and the API has no copy of either: its logs come from the store.
        assert not (host_b / job_id / "logs" / f"attempt-{first}").exists()
        assert not (host_a / job_id / "logs" / f"attempt-{last}").exists()
        assert not any(p.is_file() for p in settings.runs_dir.rglob("*"))
        before = client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": first})
        assert before.status_code == 200 and "training steps 1..16" in before.text, before.text[-2000:]
        # As far as host A's last upload before it died: what it had written, up to some point.
        assert (host_a / job_id / "logs" / f"attempt-{first}" / "ranks.log").read_text().startswith(before.text)
        after = client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": last})
        assert after.status_code == 200 and "resumed from step_" in after.text, after.text[-2000:]
        followed = client.get(f"/v1/jobs/{job_id}/logs", params={"attempt": last, "rank": 0, "follow": "true"})
        assert followed.status_code == 200 and "resumed from step_" in followed.text


def test_a_scripts_own_checkpoint_resumes_on_another_host_from_the_store(services: Services, settings: Settings,
                                                                        s3: SeaweedS3, tmp_path: Path) -> None:
    store_env, host_a, host_b, store = _hosts(services, settings, s3, tmp_path)
    repo = tmp_path / "nanogpt"
    repo.mkdir()
    (repo / "train.py").write_text(NANOGPT_TRAIN)
    doomed = services.start_worker("host-a", TORCHYARD_RUNS_DIR=str(host_a), **store_env)
    with Client(services.url, services.headers["Authorization"].removeprefix("Bearer ")) as sdk:
        code = sdk.upload_code(repo).digest
    spec = {"kind": "script", "name": "nano", "entrypoint": "train.py", "code": code, "resume_args": ["--init_from=resume"],
            "checkpoint": {"discover": ["out/*.pt"]}}
    with services.client() as client:
        created = client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]

        def saved_in_store() -> bool:
            newest = found_checkpoints.newest_found(store, job_id)
            return newest is not None and (newest.step or 0) >= 10

        _host_dies_once(services, doomed, job_id, saved_in_store, host_b, store_env)
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=300)
        resumed = rank_logs(host_b / job_id, job["attempt"])
        assert job["status"] == "succeeded", (job["error"], resumed[-3000:])
        assert_resumed_after_a_kill(job)

        # Host B had neither the code nor the checkpoint but from the store, and the script resumed from the latter.
        start = attempts(settings, job_id)[-1].resumed_from_step
        assert start is not None and start >= 10, start
        assert f"starting at iter {start} (init_from=resume)" in resumed, resumed[-3000:]
        assert job["attempts"][-1]["note"] is None
        assert not (host_b / job_id / "logs" / "attempt-1").exists()
        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "loss"}).json()["items"]
        assert [p["step"] for p in points] == list(range(1, 41))  # every step once
        assert [c["step"] for c in checkpoints(client, job_id)][-1] == 40

        # What the script wrote, from the store: its checkpoint as last saved, its TensorBoard files of the last attempt.
        listed = [a["path"] for a in client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]]
        assert "workdir/out/ckpt.pt" in listed and "workdir/train.py" not in listed, listed
        assert any(p.startswith(f"workdir/tb/attempt{job['attempt']}/") for p in listed), listed
        got = client.get(f"/v1/jobs/{job_id}/artifacts/workdir/out/ckpt.pt")
        assert got.status_code == 200, got.text
        assert torch.load(io.BytesIO(got.content), weights_only=True)["iter_num"] == 40
        # The API's own runs directory holds the uploaded code (it takes uploads) and nothing of the job.
        assert not (settings.runs_dir / job_id).exists()
        # One manifest per path: the older saves of out/ckpt.pt were dropped as newer ones went up.
        assert len(store.list(f"jobs/{job_id}/{found_checkpoints.FOUND}")) == 1
