"""Sweeps on real processes: an API, a worker (scheduler, sweep controller, supervisors) and torchrun trials on the CPU."""

from __future__ import annotations

import json
import signal
import textwrap
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from tests.helpers import LAPSED, Services, wait_until
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.slow

CPU = {"nproc_per_node": 1, "device": "cpu"}
# Tiny: a trial is mostly torchrun's start.
MLP = {"name": "mlp", "model": {"name": "mlp", "args": {"hidden": 32}}, "parallel": CPU,
       "data": {"name": "synthetic-classification", "args": {"samples": 2048, "features": 16, "classes": 4, "eval_samples": 256}},
       "train": {"epochs": 100, "global_batch_size": 32}}
# On this task, with AdamW, 0.03 leads the others at every rung (10, 20 and 40 steps). Grid order starts it last: the
# first trials to reach a rung are promoted before it arrives (asynchronous), and it still goes on to win.
LRS = [0.0001, 0.001, 0.0003, 0.03]
WINNING_LR = 0.03
SCRIPT = textwrap.dedent("""
    import argparse, time
    from torchyard import report
    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float)
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    time.sleep(a.sleep)
    report.metrics(1, score=-(a.x - 3.0) ** 2)
""")


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def run_sweep(services: Services, client: httpx.Client, body: dict[str, Any], timeout_s: float = 240) -> dict[str, Any]:
    created = client.post("/v1/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep_id = created.json()["id"]

    def done() -> dict[str, Any] | None:
        sweep = client.get(f"/v1/sweeps/{sweep_id}").json()
        return sweep if sweep["status"] != "running" else None

    return wait_until(done, timeout_s, interval_s=0.5, what=f"sweep {sweep_id} to finish")


def jobs_of(client: httpx.Client, sweep_id: str) -> list[dict[str, Any]]:
    return client.get("/v1/jobs", params={"label": f"torchyard/sweep={sweep_id}", "limit": 100}).json()["items"]


def test_a_grid_of_four_catalog_trials_ends_with_four_succeeded_jobs(services: Services) -> None:
    services.start_api()
    services.start_worker("cpu-box", TORCHYARD_WORKER_CPU_SLOTS="4")
    body = {"name": "grid", "spec": {**MLP, "train": {**MLP["train"], "max_steps": 20}}, "method": "grid",
            "metric": "eval/accuracy", "mode": "max", "max_concurrent_trials": 4,
            "space": {"train.lr": {"type": "choice", "values": [0.03, 0.0001]}, "model.args.hidden": {"type": "choice", "values": [8, 32]}}}
    with services.client() as client:
        sweep = run_sweep(services, client, body)
        assert sweep["status"] == "succeeded", sweep
        jobs = jobs_of(client, sweep["id"])
        assert sorted(j["status"] for j in jobs) == ["succeeded"] * 4
        assert sorted((t["params"]["train.lr"], t["params"]["model.args.hidden"]) for t in sweep["trials"]) == [
            (0.0001, 8), (0.0001, 32), (0.03, 8), (0.03, 32)]
        assert all(t["state"] == "succeeded" and t["last_step"] == 20 for t in sweep["trials"])
        # The best is the trial with the best final accuracy, and a tiny learning rate is not it.
        best = max(sweep["trials"], key=lambda t: t["last_value"])
        assert sweep["best_trial"] == best["number"] and sweep["best_params"]["train.lr"] == 0.03


def test_a_script_sweep_over_args_survives_a_restart_of_its_controller(services: Services) -> None:
    (services.settings.code_dir / "quad.py").write_text(SCRIPT)
    services.start_api(TORCHYARD_SECRETS_KEY=Fernet.generate_key().decode(), TORCHYARD_WEBHOOK_ALLOW_HOSTS="127.0.0.1")
    first = services.start_worker("box-a", TORCHYARD_WORKER_CPU_SLOTS="2")
    receiver = Receiver()
    body = {"name": "quad", "method": "grid", "metric": "score", "mode": "max", "max_concurrent_trials": 2,
            "spec": {"kind": "script", "name": "quad", "entrypoint": "quad.py", "args": ["--sleep", "3"], "parallel": CPU,
                     "retries": 2},
            "space": {"args.--x": {"type": "choice", "values": [1, 2, 3, 4, 5]}}}
    with services.client() as client:
        hook = client.post("/v1/webhooks", json={"url": receiver.url("/"), "events": ["sweep.finished"]})
        assert hook.status_code == 201, hook.text
        sweep_id = client.post("/v1/sweeps", json=body).json()["id"]
        wait_until(lambda: len(jobs_of(client, sweep_id)) >= 2, 60, what="the first two trials")
        # The worker that leads both the scheduler and the sweep controller stops mid-sweep; another takes over.
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
        services.start_worker("box-b", TORCHYARD_WORKER_CPU_SLOTS="2")

        def done() -> dict[str, Any] | None:
            sweep = client.get(f"/v1/sweeps/{sweep_id}").json()
            return sweep if sweep["status"] != "running" else None

        sweep = wait_until(done, 240, interval_s=0.5, what="the sweep to finish")
        assert sweep["status"] == "succeeded", sweep
        jobs = jobs_of(client, sweep_id)
        assert len(jobs) == 5 and sorted(j["status"] for j in jobs) == ["succeeded"] * 5  # no trial lost, none twice
        assert sweep["best_params"] == {"args.--x": 3}
        assert {json.dumps(j["labels"], sort_keys=True) for j in jobs} == {
            json.dumps({"torchyard/sweep": sweep_id, "torchyard/trial": str(n)}, sort_keys=True) for n in range(5)}
        detail = client.get(f"/v1/jobs/{sweep['trials'][2]['job_id']}").json()
        assert detail["spec"]["args"] == ["--sleep", "3", "--x", "3"]
        # The sweep's end reaches its owner's webhook once, across the controller's restart.
        (got,) = wait_until(lambda: list(receiver.accepted("/").values()) or None, 60, what="the sweep.finished webhook")
        receiver.close()
        assert got.json["type"] == "sweep.finished" and got.signed_by(hook.json()["secret"])
        assert got.json["sweep"]["id"] == sweep_id and got.json["sweep"]["status"] == "succeeded"


def test_asha_stops_the_losers_at_each_rung_and_promotes_the_best_from_their_checkpoints(
        services: Services) -> None:
    services.start_api()
    # Steps at full speed: a trial stops at its rung by itself, however quickly it gets there.
    services.start_worker("cpu-box", TORCHYARD_WORKER_CPU_SLOTS="3")
    # Three rungs of halving (10, 20, 40 steps): the fewest trials that stop some at each rung and pause the winner twice.
    body = {"name": "lr-asha", "spec": MLP, "method": "asha", "metric": "eval/loss", "mode": "min", "max_trials": 4,
            "max_concurrent_trials": 3, "asha": {"min_resource": 10, "reduction_factor": 2, "rungs": 3, "sampler": "grid"},
            "space": {"train.lr": {"type": "choice", "values": LRS}}}
    with services.client() as client:
        sweep = run_sweep(services, client, body, timeout_s=420)
        assert sweep["status"] == "succeeded", sweep
        trials = {t["params"]["train.lr"]: t for t in sweep["trials"]}
        assert sweep["best_params"] == {"train.lr": WINNING_LR}
        assert sorted(t["rung"] for t in sweep["trials"]) == [0, 0, 1, 2]
        for t in sweep["trials"]:
            job = client.get(f"/v1/jobs/{t['job_id']}").json()
            # Trained exactly to the rung it was allowed, not a step past it, and never a step twice.
            assert job["last_step"] == [10, 20, 40][t["rung"]], (t, job["attempts"])
            trained = [a for a in job["attempts"] if a["outcome"] not in LAPSED]
            assert [a["resumed_from_step"] or 0 for a in trained] == [0, 10, 20][:t["rung"] + 1], job["attempts"]
            if t["rung"] == 2:
                assert t["state"] == "succeeded" and job["status"] == "succeeded" and job["last_step"] == 40
            else:
                assert t["state"] == "stopped" and job["status"] == "cancelled"
                assert any(tr["reason"].startswith("early_stopped: sweep lr-asha: not among the best 1/2")
                           for tr in job["transitions"]), job["transitions"]
        winner = client.get(f"/v1/jobs/{trials[WINNING_LR]['job_id']}").json()
        # Paused at rungs 0 and 1, it went back in line and each later attempt resumed from its own checkpoint.
        paused = [tr for tr in winner["transitions"] if tr["to_status"] == "queued" and "paused at" in tr["reason"]]
        assert len(paused) == 2, winner["transitions"]
        # An attempt lost to a lapsed lease on a busy machine (nothing of it counted) may sit between them.
        ran = [a for a in winner["attempts"] if a["outcome"] not in LAPSED]
        resumed = [a["resumed_from_step"] for a in ran[1:]]
        assert resumed == [10, 20], winner["attempts"]
        steps = [m["step"] for m in client.get(f"/v1/jobs/{winner['id']}/metrics", params={"name": "eval/loss"}).json()["items"]]
        assert steps == list(range(10, 41, 10))  # one curve, continuous across the pauses
