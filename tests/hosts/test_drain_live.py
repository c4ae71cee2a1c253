"""A drain on real processes: two workers (hosts) with one simulated GPU each; a checkpointing job running on
one host is stopped by the drain the way a preemption stops it, resumes on the other with every step once and no
retry spent, and the drained host shows draining, then drained, then ready once undrained."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from jobs.settings import Settings
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.helpers import Services, wait_until

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}
ONE_GPU = {"strategy": "ddp", "nproc_per_node": 1}


def host(client: httpx.Client, host_id: str) -> dict[str, Any]:
    resp = client.get(f"/v1/hosts/{host_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_drain_moves_a_running_job_to_another_host_with_every_step_once(services: Services, settings: Settings) -> None:
    services.start_api()
    for name in ("gpu-a", "gpu-b"):
        services.start_worker(name, TORCHYARD_WORKER_GPUS="1", **faults(slow(0.5)))
    with services.client() as client:
        wait_until(lambda: sum(h["alive"] for h in client.get("/v1/hosts").json()["items"]) == 2, 120, what="both hosts live")
        # gpu-b is held out until the job has started on gpu-a, so the drain always finds it running there
        # (30 steps of 0.5 s leave it running long after step 6, however loaded the machine).
        assert client.post("/v1/hosts/gpu-b/drain", json={"reason": "not yet"}).status_code == 200
        job = client.post("/v1/jobs", json=spec(30, parallel=ONE_GPU)).json()["id"]
        wait_step(services, client, job, 6)
        assert client.get(f"/v1/jobs/{job}").json()["placement"][0]["host"] == "gpu-a"
        assert client.post("/v1/hosts/gpu-b/undrain").json()["state"] == "ready"

        resp = client.post("/v1/hosts/gpu-a/drain", json={"reason": "replace the fan"})
        assert resp.status_code == 200, resp.text
        assert (resp.json()["state"], resp.json()["reason"]) == ("draining", "replace the fan")

        done = services.wait_status(client, job, TERMINAL, timeout_s=180)
        assert_nothing_lost(client, done, 30)  # every step's loss stored exactly once across both attempts
        assert done["attempt"] == 2 and done["spec"]["retries"] == 0
        assert [a["placement"][0]["host"] for a in done["attempts"]] == ["gpu-a", "gpu-b"]
        moved = [t["reason"] for t in done["transitions"] if t["to_status"] == "queued"]
        assert any("host gpu-a is draining: replace the fan" in why for why in moved), moved

        drained = host(client, "gpu-a")
        assert (drained["state"], drained["reason"]) == ("drained", "replace the fan")
        assert [(e["kind"], e["reason"], e["by"]) for e in drained["history"]] == [("drain", "replace the fan", "admin")]
        listed = {h["id"]: h["state"] for h in client.get("/v1/hosts").json()["items"]}
        assert listed == {"gpu-a": "drained", "gpu-b": "ready"}

        assert client.post("/v1/hosts/gpu-a/undrain").json()["state"] == "ready"
        assert [e["kind"] for e in host(client, "gpu-a")["history"]] == ["drain", "undrain"]
    tries = attempts(settings, job)
    assert [a.outcome for a in tries] == ["preempted", "succeeded"]
    assert tries[1].resumed_from_step is not None and tries[1].resumed_from_step >= 6
