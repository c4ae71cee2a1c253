"""Workers die, are stopped or lose their database lease; the job still finishes, with nothing lost."""

from __future__ import annotations

import signal

import pytest

from jobs.settings import Settings
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from worker.processes import marked_processes

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.slow


def test_whole_worker_sigkilled_mid_job_resumes_on_a_new_worker(services: Services, settings: Settings) -> None:
    services.start_api()
    doomed = services.start_worker("doomed", **faults(slow()))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(40)).json()["id"]
        wait_step(services, client, job_id, 12)
        services.kill_worker(doomed, whole=True)
        wait_until(lambda: marked_processes(job_id) == [], 10, what="the job's processes to die with their worker")
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
    first = services.start_worker("preempted", **faults(slow()))
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
