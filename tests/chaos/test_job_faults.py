"""Jobs that crash, hang, run too long or are cancelled end in the right state, with no stray process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.settings import Settings
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.helpers import Services, assert_only_lapses_between, wait_until
from worker.sandbox.processes import marked_processes

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.slow


def _world_sizes(run_dir: str) -> list[int]:
    lines = Path(run_dir, "events.jsonl").read_text().splitlines()
    return [e["world_size"] for e in map(json.loads, lines) if e.get("phase") == "starting"]


def test_rank_raising_restarts_within_attempt_or_fails_with_its_traceback(services: Services) -> None:
    """Also two jobs at once on one host: each keeps its own rendezvous (world size 2, not 4)."""
    services.start_api()
    crash = faults({"action": "raise", "step": 3, "rank": 1, "restart": 0, "attempt": 1}, slow(0.05))
    services.start_worker("a", **crash)
    services.start_worker("b", **crash)
    with services.client() as client:
        restarted = client.post("/v1/jobs", json=spec(20, ranks=2, max_restarts=1)).json()["id"]
        failing = client.post("/v1/jobs", json=spec(20, ranks=2, max_restarts=0)).json()["id"]
        wait_until(lambda: all(client.get(f"/v1/jobs/{j}").json()["status"] != "queued" for j in (restarted, failing)),
                   60, what="both jobs to start")
        ok = services.wait_status(client, restarted, TERMINAL)
        bad = services.wait_status(client, failing, TERMINAL)

        assert_nothing_lost(client, ok, 20)
        assert ok["attempt"] == 1  # recovered inside the attempt by torchrun's restart
        assert _world_sizes(ok["run_dir"]) == [2, 2]  # started twice, each time with its own two ranks

        assert bad["status"] == "failed"
        error = bad["error"]
        assert error["type"] == "training_error"
        assert error["message"].startswith("rank 1: InjectedFault")
        assert "Traceback" in error["traceback"] and "injected fault at step 3 on rank 1" in error["traceback"]
        assert "[rank1]" in error["log_tail"]
        assert error["exit_code"] not in (None, 0)
        assert _world_sizes(bad["run_dir"]) == [2]
        assert marked_processes(failing) == []


def test_timeout_and_cancel_stop_every_process(services: Services) -> None:
    services.start_api()
    services.start_worker("a", **faults(slow(0.2)))
    services.start_worker("b", **faults(slow(0.2)))
    with services.client() as client:
        too_long = client.post("/v1/jobs", json=spec(200, timeout_s=6)).json()["id"]
        alice = client.post("/v1/keys", json={"owner": "alice", "name": "a"}).json()["key"]
        cancelled = client.post("/v1/jobs", json=spec(200), headers={"Authorization": f"Bearer {alice}"}).json()["id"]
        wait_step(services, client, cancelled, 3)
        # The admin cancels alice's job: the job's history says who asked, to its end.
        assert client.post(f"/v1/jobs/{cancelled}/cancel").json()["status"] == "cancelling"
        stopped = services.wait_status(client, cancelled, TERMINAL, timeout_s=60)
        timed_out = services.wait_status(client, too_long, TERMINAL, timeout_s=60)

        assert stopped["status"] == "cancelled"
        assert [t["reason"] for t in stopped["transitions"]][-2:] == ["cancel requested by admin", "cancelled by admin"]
        assert marked_processes(cancelled) == []
        # SIGTERM gave the trainer time to save where it stopped.
        saved = client.get(f"/v1/jobs/{cancelled}/checkpoints").json()["items"]
        assert saved and saved[-1]["step"] == stopped["last_step"]
        assert client.post(f"/v1/jobs/{cancelled}/cancel").status_code == 409

        assert timed_out["status"] == "failed"
        assert timed_out["error"]["type"] == "timeout"
        assert "timeout_s=6" in timed_out["error"]["message"]
        assert marked_processes(too_long) == []
        assert client.post(f"/v1/jobs/{too_long}/cancel").status_code == 409


def test_hung_rank_is_stopped_by_the_stall_watchdog_and_retried(services: Services, settings: Settings) -> None:
    services.start_api()
    services.start_worker("a", **faults({"action": "hang", "step": 4, "rank": 1, "restart": None, "attempt": 1}))
    with services.client() as client:
        # 30 s without a step: far past a healthy step at load 15, where 10 s also stopped the retry, which ran clean.
        job_id = client.post("/v1/jobs", json=spec(20, ranks=2, stall_timeout_s=30, retries=1)).json()["id"]
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=300)
        assert_nothing_lost(client, job, 20)
    tries = [(a.outcome, a.error_type) for a in attempts(settings, job_id)]
    assert tries[0] == ("failed", "stalled") and tries[-1] == ("succeeded", None), tries
    # The one retry is spent on the stall. At load 25 a lease lapsed between them once ("lost": its worker missed
    # renewals), which costs no retry; nothing else may come between.
    assert_only_lapses_between([outcome for outcome, _ in tries])
    assert len(tries) <= 4, tries
