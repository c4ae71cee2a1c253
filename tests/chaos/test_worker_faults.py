"""Workers die, are stopped or lose their database lease; the job still finishes, with nothing lost."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from jobs.settings import Settings
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, loss_steps, slow, spec, wait_step
from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from worker.sandbox.processes import marked_processes

log = logging.getLogger(__name__)

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.slow


def test_whole_worker_sigkilled_mid_job_resumes_on_a_new_worker(services: Services, settings: Settings) -> None:
    services.start_api()
    doomed = services.start_worker("doomed", **faults(slow(0.5)))  # 14 s left after step 12: the kill lands mid-job
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(40)).json()["id"]
        wait_step(services, client, job_id, 12)
        services.kill_worker(doomed, whole=True)
        wait_until(lambda: marked_processes(job_id) == [], 60, what="the job's processes to die with their worker")
        services.start_worker("rescuer")
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
        assert_nothing_lost(client, job, 40)
        assert_resumed_after_a_kill(job)
    tries = attempts(settings, job_id)
    assert "lost" in [t.outcome for t in tries[:-1]]  # the attempt the kill ended
    assert tries[-1].resumed_from_step is not None and tries[-1].resumed_from_step >= 10


def test_sigkill_of_only_the_rq_main_process_loses_nothing(services: Services) -> None:
    services.start_api()
    worker = services.start_worker("headless", **faults(slow(0.1)))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(30)).json()["id"]
        wait_step(services, client, job_id, 5)
        services.kill_worker(worker, whole=False)
        # The work horse keeps supervising; a fresh worker is there for anything that needs requeueing.
        services.start_worker("spare")
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
        assert_nothing_lost(client, job, 30)


def test_sigterm_preempts_checkpoints_and_resumes_elsewhere(services: Services, settings: Settings) -> None:
    services.start_api()
    first = services.start_worker("preempted", **faults(slow(0.5)))  # 15 s left after step 10 for the SIGTERM to land
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(40, retries=0)).json()["id"]
        wait_step(services, client, job_id, 10)
        first.send_signal(signal.SIGTERM)  # what `docker stop` sends
        queued = services.wait_status(client, job_id, {"queued", *TERMINAL}, timeout_s=60)
        assert queued["status"] == "queued"
        assert first.wait(30) == 0  # the worker itself shuts down cleanly once the job is handed back
        services.start_worker("second")
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
        assert_nothing_lost(client, job, 40)
        # Preemption is not a failure: it spent no retry.
        assert job["attempt"] == 2 and job["max_attempts"] == 2
    tries = attempts(settings, job_id)
    assert [a.outcome for a in tries] == ["preempted", "succeeded"]
    assert tries[1].resumed_from_step >= 10  # the checkpoint saved on SIGTERM, not only the periodic one before it


def _environ_marks() -> set[str]:
    """The job ids of every process whose environment carries a job mark, read from /proc as an operator would."""
    found = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        found |= {item.partition(b"=")[2].decode() for item in items if item.startswith(b"TORCHYARD_JOB_ID=")}
    return found


def test_workers_killed_while_two_rank_jobs_start_leave_no_attempt_behind(services: Services, settings: Settings) -> None:
    """Jobs run as the worker's own user (no uid to kill by). A worker is killed at a random moment of each job's
    start, its whole tree or its own process alone; every job still trains each step once, and once they are done
    no process of any of their attempts is left."""
    seed = int(os.environ.get("TORCHYARD_CHAOS_SEED", random.randrange(1 << 30)))
    log.info("chaos seed %d (TORCHYARD_CHAOS_SEED)", seed)
    rng = random.Random(seed)
    services.start_api()
    # What a crashed worker of this deployment left: marked with an attempt no lease holds.
    ghost = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={
        **os.environ, "TORCHYARD_JOB_ID": "ghost", "TORCHYARD_ATTEMPT": "1",
        "TORCHYARD_RUN_DIR": str((settings.runs_dir / "ghost").resolve())})
    try:
        worker = services.start_worker("w0", **faults(slow(0.1)))
        assert ghost.wait(120) == -signal.SIGKILL  # the worker's start ended it
        jobs = []
        with services.client() as client:
            for i, whole in enumerate([True, False, True, False]):
                job_id = client.post("/v1/jobs", json=spec(10, ranks=2)).json()["id"]
                jobs.append(job_id)
                services.wait_status(client, job_id, {"running", *TERMINAL})
                wait_until(lambda: marked_processes(job_id), 120, what=f"job {job_id}'s processes to start")  # noqa: B023
                moment = rng.uniform(0.0, 4.0)
                log.info("job %s: killing the worker (%s) %.2fs into its start", job_id, "whole" if whole else "alone", moment)
                time.sleep(moment)  # where the fault lands, not a wait for an event
                services.kill_worker(worker, whole=whole)
                worker = services.start_worker(f"w{i + 1}", **faults(slow(0.1)))
                job = services.wait_status(client, job_id, TERMINAL, timeout_s=180)
                assert job["status"] == "succeeded", (seed, job["error"])
                assert loss_steps(client, job_id) == list(range(1, 11)), seed
        wait_until(lambda: not (_environ_marks() & set(jobs)), 60, what="every attempt's processes to end")
    finally:
        if ghost.poll() is None:
            ghost.kill()
        ghost.wait()
