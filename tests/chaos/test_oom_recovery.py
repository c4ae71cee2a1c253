"""OOM recovery: with train.auto_micro_batch, an attempt that runs out of memory is retried with half
the micro-batch and twice grad_accum_steps, and trains the same loss curve as a job that never did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.settings import Settings
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, spec
from tests.helpers import Services

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.slow
STEPS = 8


def _losses(client, job_id: str) -> dict[int, float]:
    items = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss", "limit": 10000}).json()["items"]
    return {m["step"]: m["value"] for m in items}


def test_an_oom_attempt_is_retried_with_half_the_micro_batch_and_the_same_losses(services: Services, settings: Settings) -> None:
    services.start_api()
    # Rank 1 raises CUDA's OutOfMemoryError after step 5 of the first attempt only.
    faulty = services.start_worker("a", **faults({"action": "oom", "step": 5, "rank": 1, "restart": None, "attempt": 1}))
    body = spec(STEPS, ranks=2, checkpoint={"every_steps": 2})
    body["train"] = {**body["train"], "auto_micro_batch": True}
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=body).json()["id"]
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=240)
        assert_nothing_lost(client, job, STEPS)
        assert job["adjustments"] == [{"attempt": 2, "reason": "out_of_memory", "field": "train.grad_accum_steps",
                                       "from": 1, "to": 2, "micro_batch": {"from": 16, "to": 8}}]
        assert job["spec"]["train"]["grad_accum_steps"] == 2 and job["spec"]["train"]["global_batch_size"] == 32
        assert json.loads(Path(job["run_dir"], "spec.json").read_text())["train"]["grad_accum_steps"] == 2
        tries = attempts(settings, job_id)
        assert [(a.outcome, a.error_type, a.resumed_from_step) for a in tries] == [
            ("failed", "out_of_memory", 0), ("succeeded", None, 4)]
        recovered = _losses(client, job_id)

        # The same job without the fault (and without the option), on a worker without faults: the reference.
        services.kill_worker(faulty)
        services.start_worker("b")
        plain = spec(STEPS, ranks=2, checkpoint={"every_steps": 2})
        ref_id = client.post("/v1/jobs", json=plain).json()["id"]
        ref = services.wait_status(client, ref_id, TERMINAL, timeout_s=240)
        assert ref["status"] == "succeeded" and ref["adjustments"] == []
        reference = _losses(client, ref_id)
    assert sorted(recovered) == sorted(reference) == list(range(1, STEPS + 1))
    for step in reference:
        assert recovered[step] == pytest.approx(reference[step], abs=1e-5), step


def test_without_the_option_an_oom_fails_the_job(services: Services) -> None:
    services.start_api()
    services.start_worker("a", **faults({"action": "oom", "step": 2, "rank": 0, "restart": None, "attempt": 1}))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(4)).json()["id"]
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=180)
    assert job["status"] == "failed" and job["error"]["type"] == "out_of_memory"
    assert "CUDA out of memory" in job["error"]["traceback"]
    assert job["adjustments"] == [] and job["spec"]["train"]["grad_accum_steps"] == 1
