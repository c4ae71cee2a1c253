"""Multi-node jobs: several local workers stand in for hosts (gloo on the CPU, shared run directory).

The scheduler reserves every node of a gang in one decision or none; a gang that does not fit waits with
its reason and holds nothing (docs/multinode.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobs.settings import Settings
from tests.chaos.conftest import attempts, faults, loss_steps, slow, spec, wait_step
from tests.helpers import Services, assert_only_lapses_between, wait_until
from worker.sandbox.processes import marked_processes

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.slow
# Every node on this one machine. The join timeout is a deadline, not a wait: on a busy 2-core machine the nodes of
# two gangs importing torch at once have started more than 30 s apart.
GANG_ENV = {"TORCHYARD_WORKER_HOST": "127.0.0.1", "TORCHYARD_GANG_JOIN_TIMEOUT_S": "90"}


def gang_spec(steps: int, nproc: int = 1, **overrides: Any) -> dict[str, Any]:
    body = spec(steps, **overrides)
    body["parallel"] = {"strategy": "ddp", "nnodes": 2, "nproc_per_node": nproc}
    body["train"]["global_batch_size"] = 32
    return body


def world_sizes(job: dict[str, Any]) -> set[int]:
    """World sizes the trainer reported in its starting/training status events."""
    sizes = set()
    for line in (Path(job["run_dir"]) / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "status" and "world_size" in event:
            sizes.add(event["world_size"])
    return sizes


def assert_finished(client: httpx.Client, job: dict[str, Any], steps: int, world: int) -> None:
    assert job["status"] == "succeeded", job["error"]
    assert loss_steps(client, job["id"]) == list(range(1, steps + 1))  # continuous, each step once
    assert world_sizes(job) == {world}
    wait_until(lambda: marked_processes(job["id"]) == [], 60, what="no process of the job left")


def test_two_node_jobs_of_one_and_two_processes_succeed(services: Services) -> None:
    """2 x 1 with DDP; 2 x 2 with FSDP2 as HSDP: replicated across the two nodes, sharded within each."""
    services.start_api()
    services.start_worker("node-a", **GANG_ENV)
    services.start_worker("node-b", **GANG_ENV)
    with services.client() as client:
        for nproc, strategy in ((1, "ddp"), (2, "fsdp")):
            body = gang_spec(8, nproc)
            body["parallel"].update(strategy=strategy, **({"fsdp": {"hsdp": True}} if strategy == "fsdp" else {}))
            job_id = client.post("/v1/jobs", json=body).json()["id"]
            job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
            assert_finished(client, job, 8, 2 * nproc)
            assert job["attempt"] == 1
        rank_logs = "".join(p.read_text(errors="replace") for p in Path(job["run_dir"]).glob("logs/**/stderr.log"))
        assert "FSDP2 mesh (2, 2) ('replicate', 'shard')" in rank_logs


def test_one_worker_waits_with_the_reason_and_starts_when_a_second_joins(services: Services) -> None:
    services.start_api()
    services.start_worker("alone", **GANG_ENV)
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=gang_spec(6)).json()["id"]
        detail = wait_until(lambda: (d := client.get(f"/v1/jobs/{job_id}").json())["waiting_reason"] and d, 60,
                            what="the gang's waiting reason")
        assert detail["status"] == "queued" and detail["nodes_needed"] == 2
        assert detail["waiting_reason"] == "needs 2 hosts with 1 CPU slot; only 1 has 1"
        time.sleep(2)  # passes go on meanwhile; the job stays queued and holds nothing of the lone host
        still = client.get(f"/v1/jobs/{job_id}").json()
        assert still["status"] == "queued" and still["placement"] is None
        assert client.get("/v1/hosts").json()["items"][0]["cpu_slots"]["used"] == 0
        assert marked_processes(job_id) == []  # nothing of it ran on the lone worker
        services.start_worker("second", **GANG_ENV)
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=120)
        assert_finished(client, job, 6, 2)


def test_two_gangs_and_a_one_node_job_on_three_hosts_all_finish(services: Services) -> None:
    services.start_api()
    for name in ("node-a", "node-b", "node-c"):
        services.start_worker(name, TORCHYARD_WORKER_CPU_SLOTS="1", **GANG_ENV)
    with services.client() as client:
        # One gang takes two hosts, the one-node job the third; the second gang waits for two hosts, then runs.
        ids = [client.post("/v1/jobs", json=gang_spec(6)).json()["id"] for _ in range(2)]
        single = spec(6)
        single["parallel"] = {"strategy": "ddp", "nproc_per_node": 1}
        ids.append(client.post("/v1/jobs", json=single).json()["id"])
        for job_id, world in zip(ids, (2, 2, 1), strict=True):
            job = services.wait_status(client, job_id, TERMINAL, timeout_s=150)
            assert_finished(client, job, 6, world)


@pytest.mark.parametrize("victim", ["follower", "leader"])
def test_killing_a_node_worker_resumes_the_gang_elsewhere(services: Services, settings: Settings, victim: str) -> None:
    """SIGKILL of one node's whole worker (a crashed container): the other node stops too (node 0 sees the
    follower's heartbeat expire, or a follower sees node 0's), and a new gang resumes from the checkpoint."""
    services.start_api()
    # 0.6 s a step on the first attempt: 10 s are left after step 7 (0.2 s left 3.4 s) for the kill to land mid-job.
    workers = {name: services.start_worker(name, **GANG_ENV, **faults(slow(0.6, attempt=1))) for name in ("node-a", "node-b")}
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=gang_spec(24)).json()["id"]
        running = wait_step(services, client, job_id, 7)
        leader = running["worker_id"]
        doomed = leader if victim == "leader" else next(name for name in workers if name != leader)
        services.kill_worker(workers[doomed], whole=True)
        services.start_worker("rescuer", **GANG_ENV)
        # Far past a healthy resume (40-60 s): with two suites and a compose stack on two cores it took over 150 s.
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=400)
        assert_finished(client, job, 24, 2)
    tries = attempts(settings, job_id)
    # Lost, then resumed to the end. On a loaded machine with this module's 3 s lease a placement may lapse once more
    # before its nodes adopt it ("lost") or start ("not_started"), each costing no retry; nothing else may happen between.
    outcomes = [a.outcome for a in tries]
    assert outcomes[0] == "lost" and outcomes[-1] == "succeeded", outcomes
    assert_only_lapses_between(outcomes)
    assert len(tries) <= 4, outcomes
    assert tries[-1].resumed_from_step is not None and tries[-1].resumed_from_step >= 5


def test_cancel_and_timeout_stop_every_node(services: Services) -> None:
    services.start_api()
    for name in ("node-a", "node-b"):
        services.start_worker(name, **GANG_ENV, **faults(slow(0.3)))
    with services.client() as client:
        cancelled = client.post("/v1/jobs", json=gang_spec(100)).json()["id"]
        wait_step(services, client, cancelled, 3)
        assert client.post(f"/v1/jobs/{cancelled}/cancel").status_code == 200
        job = services.wait_status(client, cancelled, TERMINAL, timeout_s=60)
        assert job["status"] == "cancelled"
        wait_until(lambda: marked_processes(cancelled) == [], 60, what="every node of the cancelled job to stop")

        timed = client.post("/v1/jobs", json=gang_spec(100, timeout_s=12)).json()["id"]
        job = services.wait_status(client, timed, TERMINAL, timeout_s=90)
        assert job["status"] == "failed" and job["error"]["type"] == "timeout", job["error"]
        wait_until(lambda: marked_processes(timed) == [], 60, what="every node of the timed-out job to stop")


def test_a_follower_ranks_error_is_the_jobs_error(services: Services) -> None:
    """Global rank 1 raises: rank 0, on the other node, then fails too, on the collective its peer left. The job's
    error is rank 1's, with its traceback, not the connection error the other node saw a moment later."""
    services.start_api()
    crash = faults({"action": "raise", "step": 3, "rank": 1, "restart": 0, "attempt": 1}, slow(0.05))
    for name in ("node-a", "node-b"):
        services.start_worker(name, **GANG_ENV, **crash)
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=gang_spec(20, max_restarts=0)).json()["id"]
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=150)
    assert job["status"] == "failed", job
    error = job["error"]
    assert error["type"] == "training_error", error
    # torchrun numbers the nodes' ranks by its rendezvous (the agents' address, then pid), not by the worker's node
    # index: global rank 1 ran on node 1, or on node 0 when node 1's torchrun sorted first. The error names the node
    # it ran on, by its own file (torchrun's error file of node 1 holds node 1's first failure), and that node's host.
    follower_error = Path(job["run_dir"]) / "error-node-1.json"
    node = 1 if follower_error.is_file() and "InjectedFault" in follower_error.read_text() else 0
    [host] = [n["host"] for n in job["placement"] if n["node_rank"] == node]
    assert host in ("node-a", "node-b"), job["placement"]
    expected = f"node {node} (host {host}): rank 1: InjectedFault"
    assert error["message"].startswith(expected), (error["message"], node)
    assert "injected fault at step 3 on rank 1" in error["traceback"]
    wait_until(lambda: marked_processes(job_id) == [], 60, what="every node of the failed job to stop")
