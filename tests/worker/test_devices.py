"""nproc_per_node 'gpu' and ranks against the worker's GPUs: counted, placed, and refused at the claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.settings import Settings
from jobspec.spec import parse_spec
from tests.helpers import Services, wait_until
from worker.devices import PlacementError, gpu_count, place

TERMINAL = {"succeeded", "failed", "cancelled"}


def _spec(nproc: object, device: str = "auto", batch: int = 32) -> dict:
    return {"name": "g", "model": {"name": "mlp", "args": {"hidden": 16}},
            "data": {"name": "synthetic-classification", "args": {"samples": 128, "eval_samples": 16, "features": 8}},
            "parallel": {"nproc_per_node": nproc, "device": device},
            "train": {"global_batch_size": batch, "max_steps": 2, "log_every_steps": 1}}


def test_gpus_are_counted_from_the_setting_then_cuda_visible_devices_then_the_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = Settings(database_url="sqlite://", worker_gpus=None)
    proc = tmp_path / "gpus"
    proc.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (proc / bus).mkdir()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_count(base, proc) == 3
    assert gpu_count(base, tmp_path / "absent") == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpu_count(base, proc) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,-1,1")  # CUDA ignores everything from an invalid id on
    assert gpu_count(base, proc) == 1
    assert gpu_count(Settings(database_url="sqlite://", worker_gpus=8), proc) == 8


def test_gpu_is_accepted_at_post_and_placed_at_the_claim() -> None:
    assert parse_spec(_spec("gpu")).parallel.nproc_per_node == "gpu"  # no world size yet: batch checked at the claim
    assert place(_spec("gpu"), 4, "w1")["parallel"]["nproc_per_node"] == 4
    assert place(_spec(2), 0, "w1")["parallel"]["nproc_per_node"] == 2  # a CPU worker runs ranks on cores
    assert place(_spec(4, device="cpu"), 2, "w1")["parallel"]["nproc_per_node"] == 4
    with pytest.raises(PlacementError, match=r"parallel.nproc_per_node: 4 ranks per node, but worker w1 has 2 GPUs"):
        place(_spec(4), 2, "w1")
    with pytest.raises(PlacementError, match="worker w1 has no GPU"):
        place(_spec("gpu"), 0, "w1")
    with pytest.raises(PlacementError, match=r"train.global_batch_size: 32 is not divisible by .* 3 .*'gpu' is 3"):
        place(_spec("gpu"), 3, "w1")


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.mark.slow
def test_a_worker_runs_gpu_as_its_gpu_count_and_holds_back_a_job_for_more(services: Services) -> None:
    services.start_api()
    # Two "GPUs" by the operator's count; the ranks still train on the CPU (device cpu), one per GPU counted.
    services.start_worker("two-gpus", TORCHYARD_WORKER_GPUS="2")
    with services.client() as client:
        fits = client.post("/v1/jobs", json=_spec("gpu", device="cpu")).json()
        too_many = client.post("/v1/jobs", json=_spec(4)).json()
        assert fits["spec"]["parallel"]["nproc_per_node"] == "gpu"
        ran = services.wait_status(client, fits["id"], TERMINAL)
        # Never placed where its ranks would share GPUs: it waits for a host big enough, saying so.
        reason = "needs 4 GPUs on one host; no host has 4 (largest: two-gpus with 2)"
        held = wait_until(lambda: (d := client.get(f"/v1/jobs/{too_many['id']}").json())["waiting_reason"] == reason and d,
                          30, what="the 4-rank job's reason")
    assert ran["status"] == "succeeded", ran["error"]
    assert ran["placement"][0]["gpus"] == [0, 1]
    starting = [json.loads(line) for line in Path(ran["run_dir"], "events.jsonl").read_text().splitlines()][0]
    assert starting["world_size"] == 2
    assert held["status"] == "queued" and held["placement"] is None


def test_gpu_indices_are_the_physical_ones_a_rank_can_be_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.devices import gpu_indices

    base = Settings(database_url="sqlite://", worker_gpus=None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpu_indices(base) == (2, 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")  # UUIDs: positions
    assert gpu_indices(base) == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_indices(base) == ()
    assert gpu_indices(Settings(database_url="sqlite://", worker_gpus=3)) == (0, 1, 2)
