"""Two hosts that share no directory, only the object store: a job's worker is SIGKILLed mid-run (its whole process
tree, as a host that dies); the job resumes on the other worker from the checkpoint in the store, every step's loss
stored once, and the API, whose own runs directory holds nothing, serves the logs of both attempts."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.settings import Settings
from jobs.storage import checkpoints as stored
from jobs.storage.store import ObjectStore
from jobs.storage.url import parse
from jobs.store.db import get_engine, init_db
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec
from tests.conftest import make_settings
from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from tests.object_store import SeaweedS3
from worker.sandbox.processes import marked_processes

pytestmark = pytest.mark.slow

STEPS = 16
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str, s3: SeaweedS3, request: pytest.FixtureRequest) -> Settings:
    """The store's settings with short leases, so the dead host's job is requeued within seconds."""
    s = make_settings(tmp_path, database_url, redis_url, storage_url=f"s3://{s3.bucket}/svc-{request.node.name[:40]}",
                      s3_endpoint_url=s3.endpoint, lease_ttl_s=3.0, stop_grace_s=8.0)
    init_db(get_engine(s.database_url))
    return s


def test_a_job_whose_host_dies_resumes_on_another_from_the_store(services: Services, settings: Settings, s3: SeaweedS3,
                                                                 tmp_path: Path) -> None:
    store_env = {"TORCHYARD_STORAGE_URL": settings.storage_url or "", "TORCHYARD_S3_ENDPOINT_URL": s3.endpoint,
                 "TORCHYARD_STORAGE_SYNC_INTERVAL_S": "1"}
    host_a, host_b = tmp_path / "host-a-runs", tmp_path / "host-b-runs"
    store = ObjectStore(parse(settings.storage_url or ""), s3.endpoint)
    services.start_api(**store_env)  # its runs directory (settings.runs_dir) is neither host's
    doomed = services.start_worker("host-a", TORCHYARD_RUNS_DIR=str(host_a), **store_env, **faults(slow(0.3)))
    one_rank = spec(STEPS, checkpoint={"every_steps": 4}, parallel={"strategy": "ddp", "nproc_per_node": 1})
    with services.client() as client:
        created = client.post("/v1/jobs", json=one_rank)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]

        def checkpoint_in_store() -> bool:
            newest = stored.newest_stored(store, job_id)
            return newest is not None and (newest.step or 0) >= 4

        wait_until(checkpoint_in_store, 240, interval_s=0.5, what="a complete checkpoint of host A in the store")
        services.kill_worker(doomed, whole=True)
        wait_until(lambda: marked_processes(job_id) == [], 10, what="the job's processes to die with their host")
        services.start_worker("host-b", TORCHYARD_RUNS_DIR=str(host_b), **store_env)
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
