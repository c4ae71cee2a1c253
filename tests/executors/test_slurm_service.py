"""The whole service on Slurm: the API and a worker with ``TORCHYARD_EXECUTOR=slurm`` against a private
single-host Slurm (stack/slurm_cluster.py), checked through the API as a user sees it, plus squeue and
the process table: a job runs to success with its metrics and checkpoints in SQL; a cancel leaves
nothing behind; Slurm's time limit fails the job as a timeout; a preempted job resumes from its
checkpoint in a new attempt (a new Slurm job); a request Slurm can never schedule fails at once.
Skipped, with the reason, where Debian's slurm-wlm and munge are not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from stack.slurm_cluster import SlurmCluster
from tests.chaos.conftest import faults, loss_steps, slow, wait_step
from tests.conftest import make_settings
from tests.executors.conftest import events, job_spec
from tests.helpers import Services, wait_until
from worker.sandbox.processes import marked_processes

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SECRETS_KEY = Fernet.generate_key().decode()
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    s = make_settings(tmp_path, database_url, redis_url, stop_grace_s=15.0)
    init_db(get_engine(s.database_url))
    return s


def worker_env(slurm: SlurmCluster) -> dict[str, str]:
    return {"TORCHYARD_EXECUTOR": "slurm", "TORCHYARD_SLURM_CONF": str(slurm.conf), "TORCHYARD_SLURM_PARTITION": "batch",
            "TORCHYARD_SLURM_CPUS_PER_RANK": "1", "TORCHYARD_SLURM_GPUS": "false", "TORCHYARD_SLURM_POLL_INTERVAL_S": "0.5",
            "TORCHYARD_SECRETS_KEY": SECRETS_KEY}


@pytest.fixture
def start(services: Services, slurm: SlurmCluster) -> Iterator[Callable[..., httpx.Client]]:
    """Start the API and one Slurm worker (its environment plus ``env``); a client of the API."""
    clients: list[httpx.Client] = []

    def _start(**env: str) -> httpx.Client:
        services.start_api(TORCHYARD_SECRETS_KEY=SECRETS_KEY)
        services.start_worker(**worker_env(slurm), **env)
        clients.append(services.client())
        return clients[-1]

    yield _start
    for client in clients:
        client.close()


def _submit(client: httpx.Client, body: dict[str, Any]) -> str:
    created = client.post("/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _checkpoint_steps(client: httpx.Client, job_id: str) -> list[int]:
    return sorted(c["step"] for c in client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"])


def test_a_two_process_job_succeeds_with_metrics_and_checkpoints_in_sql(services: Services, slurm: SlurmCluster,
                                                                         start: Callable[..., httpx.Client]) -> None:
    client = start()
    job_id = _submit(client, job_spec(steps=8))
    job = services.wait_status(client, job_id, TERMINAL, timeout_s=300)
    assert job["status"] == "succeeded", job["error"]
    assert loss_steps(client, job_id) == list(range(1, 9))
    assert _checkpoint_steps(client, job_id) == [4, 8]
    # The Slurm job id, in the job and in the attempt that ran: what an operator looks up in squeue or sacct. A
    # placement can lapse before its worker adopts it ("not_started": nothing ran), see docs/operations.md.
    assert job["executor_id"] and job["executor_id"].isdigit()
    ran = [(a["attempt"], a["executor_id"], a["outcome"]) for a in job["attempts"] if a["outcome"] != "not_started"]
    assert ran == [(job["attempt"], job["executor_id"], "succeeded")], job["attempts"]
    assert (Path(job["run_dir"]) / "logs" / f"attempt-{job['attempt']}" / "sbatch.sh").exists()
    assert slurm.jobs() == []
    assert marked_processes(job_id) == []


def test_a_running_job_cancelled_through_the_api_leaves_nothing_behind(services: Services, slurm: SlurmCluster,
                                                                        start: Callable[..., httpx.Client]) -> None:
    client = start(**faults(slow(0.3)))
    job_id = _submit(client, job_spec(steps=400, secrets={"HF_TOKEN": "s3cret-value"}))
    running = wait_step(services, client, job_id, 2, timeout_s=240)
    assert running["executor_id"] in slurm.jobs()
    # The decrypted secret reached the ranks Slurm started (and only their environment: it is in no spec or log).
    environs = []
    for proc in marked_processes(job_id):
        try:
            environs.append(Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
    assert any(b"HF_TOKEN=s3cret-value" in env for env in environs)
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
    assert job["status"] == "cancelled", job["error"]
    assert slurm.jobs() == []
    assert marked_processes(job_id) == []


def test_a_job_killed_by_slurms_time_limit_fails_as_a_timeout(services: Services, slurm: SlurmCluster,
                                                              start: Callable[..., httpx.Client]) -> None:
    client = start(**faults(slow(0.3)))
    job_id = _submit(client, job_spec(steps=1000, retries=2))
    running = wait_step(services, client, job_id, 1, timeout_s=240)
    # An administrator shortens the limit to Slurm's smallest, a minute; Slurm enforces it, not the supervisor.
    slurm.command("scontrol", "update", f"JobId={running['executor_id']}", "TimeLimit=1")
    job = services.wait_status(client, job_id, TERMINAL, timeout_s=240)
    assert job["status"] == "failed"
    assert job["error"]["type"] == "timeout", job["error"]
    assert "time limit" in job["error"]["message"]
    assert len(job["attempts"]) == 1  # a time limit is not retried, as timeout_s is not
    assert slurm.jobs() == []
    assert marked_processes(job_id) == []


@pytest.mark.parametrize("how", ["urgent partition", "scontrol requeue"])
def test_a_preempted_slurm_job_resumes_from_its_checkpoint(how: str, services: Services, slurm: SlurmCluster,
                                                           start: Callable[..., httpx.Client]) -> None:
    client = start(**faults(slow(0.3, attempt=1)))
    job_id = _submit(client, job_spec(steps=16))
    first = wait_step(services, client, job_id, 5, timeout_s=240)
    if how == "urgent partition":
        # A job of a higher priority tier needs the whole node: Slurm preempts ours, SIGTERM first (GraceTime).
        slurm.command("sbatch", "--parsable", "--partition=urgent", "--cpus-per-task=2", "--output=/dev/null",
                      "--wrap", "sleep 1")
    else:
        # An administrator requeues it (allowing it first: the executor submits with --no-requeue); SIGTERM, then KillWait.
        slurm.command("scontrol", "update", f"JobId={first['executor_id']}", "Requeue=1")
        slurm.command("scontrol", "requeue", first["executor_id"])
    job = services.wait_status(client, job_id, TERMINAL, timeout_s=300)
    assert job["status"] == "succeeded", job["error"]
    # On a busy machine a placement can lapse before its worker adopts it ("not_started": nothing ran, no retry spent).
    unstarted = sum(a["outcome"] == "not_started" for a in job["attempts"])
    attempts = [a for a in job["attempts"] if a["outcome"] != "not_started"]
    assert [a["outcome"] for a in attempts] == ["preempted", "succeeded"], job["attempts"]
    assert attempts[0]["executor_id"] == first["executor_id"] != attempts[1]["executor_id"]
    saved = attempts[1]["resumed_from_step"]
    assert saved is not None and saved >= 4  # the ranks saved on SIGTERM, and the next attempt went on from there
    assert job["max_attempts"] == 2 + unstarted  # retries 0: the preemption's new attempt spent no retry
    assert loss_steps(client, job_id)[-1] == 16 and set(loss_steps(client, job_id)) == set(range(1, 17))
    wait_until(lambda: slurm.jobs() == [], 60, what="the urgent job to end")  # and the requeued one is not rerun
    assert marked_processes(job_id) == []


def test_a_lost_workers_slurm_job_is_stopped_before_the_next_attempt_resumes(services: Services, slurm: SlurmCluster,
                                                                             start: Callable[..., httpx.Client]) -> None:
    client = start(**faults(slow(0.3, attempt=1)))
    job_id = _submit(client, job_spec(steps=200, checkpoint={"every_steps": 20}))
    first = wait_step(services, client, job_id, 3, timeout_s=240)
    # The worker dies whole; its Slurm job does not (slurmd runs the ranks) and trains on, unsupervised.
    services.kill_worker(services.workers[0])
    assert first["executor_id"] in slurm.jobs()
    services.start_worker(**worker_env(slurm))
    job = services.wait_status(client, job_id, TERMINAL, timeout_s=300)
    assert job["status"] == "succeeded", job["error"]
    attempts = job["attempts"]
    assert [a["executor_id"] for a in attempts][0] == first["executor_id"] != attempts[-1]["executor_id"]
    # The next attempt stopped it first (two attempts never write one run directory): SIGTERM, the ranks saved
    # where they were and exited, and the next attempt went on from exactly there.
    old = slurm.command("scontrol", "show", "job", "-o", first["executor_id"])
    assert "JobState=COMPLETED" not in old, old
    stopped = [e["step"] for e in events(Path(job["run_dir"])) if e["type"] == "status" and e["phase"] == "preempted"]
    assert len(stopped) == 1 and 3 <= stopped[0] < 200
    assert attempts[-1]["outcome"] == "succeeded" and attempts[-1]["resumed_from_step"] == stopped[0]
    assert slurm.jobs() == []
    assert marked_processes(job_id) == []


def test_a_job_slurm_can_never_schedule_fails_with_the_reason(services: Services, slurm: SlurmCluster,
                                                              start: Callable[..., httpx.Client]) -> None:
    client = start()
    job_id = _submit(client, job_spec(steps=4, nproc=4))  # 4 CPUs asked of a 2-CPU node
    job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
    assert job["status"] == "failed"
    assert job["error"]["type"] == "spec_error"
    assert "can never run" in job["error"]["message"] and "PartitionConfig" in job["error"]["message"]
    assert slurm.jobs() == []
    wait_until(lambda: not marked_processes(job_id), 60, what="no process of the job")
