"""The whole path with nothing mocked: real redis-server, the API and a worker as processes,
torchrun launching two gloo ranks, events streamed into SQL, checkpoints loaded back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import Services
from trainer.checkpoint import load_model
from worker.sandbox.processes import marked_processes

pytestmark = pytest.mark.slow

SPEC = {
    "name": "mlp-e2e",
    "model": {"name": "mlp", "args": {"hidden": 32}},
    "data": {"name": "synthetic-classification", "args": {"samples": 1024, "eval_samples": 256, "features": 16, "classes": 4}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 2, "global_batch_size": 64, "lr": 0.01, "log_every_steps": 4},
    "checkpoint": {"every_steps": 8, "keep_last": 2},
    "eval": {"every_steps": 16},
}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_post_train_poll_read_metrics_and_load_checkpoint(services: Services) -> None:
    services.start_api()
    services.start_worker()
    with services.client() as client:
        created = client.post("/v1/jobs", json=SPEC)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]

        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        assert job["error"] is None
        # One attempt ran. On a busy machine a placement can lapse before its worker adopts it: that attempt is
        # "not_started" (nothing ran, no retry spent) and the next placement runs the job.
        ran = [a for a in job["attempts"] if a["outcome"] != "not_started"]
        assert len(ran) == 1, (job.get("attempts"), job.get("transitions"))
        assert job["last_step"] == 32  # 1024 samples / 64 per step x 2 epochs
        # Each rank was forked from torchrun (torch imported once, in the launcher) and, as a fresh rank would,
        # took torchrun's one intra-op thread per rank of a shared host.
        for rank in (0, 1):
            said = client.get(f"/v1/jobs/{job_id}/logs", params={"rank": rank}).text
            assert "rank forked from torchrun, which had imported torch; 1 intra-op threads" in said, said[-2000:]

        losses = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()["items"]
        steps = [m["step"] for m in losses]
        assert steps == sorted(set(steps)) and steps[-1] == 32
        assert losses[-1]["value"] < losses[0]["value"] * 0.8
        names = {m["name"] for m in client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 10000}).json()["items"]}
        assert {"train/loss", "train/lr", "train/samples_per_s", "eval/loss", "eval/accuracy"} <= names
        accuracy = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "eval/accuracy"}).json()["items"]
        assert accuracy[-1]["value"] > 0.4  # four classes: chance is 0.25

        checkpoints = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
        assert checkpoints and checkpoints[-1]["step"] == 32
        last = Path(checkpoints[-1]["path"])
        assert last.is_dir()

        # The checkpoint loads back into the catalog model without a process group.
        model = load_model(last)
        features = torch.randn(8, 16)
        assert model(features).shape == (8, 4)
        weights = job_weights(Path(job["run_dir"]))
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, weights[name]), name

        # A spec that cannot run is refused and creates nothing.
        bad = client.post("/v1/jobs", json={**SPEC, "train": {**SPEC["train"], "global_batch_size": 63}})
        assert bad.status_code == 422
        assert "train.global_batch_size" in bad.json()["detail"]
        assert [j["id"] for j in client.get("/v1/jobs").json()["items"]] == [job_id]

    assert marked_processes(job_id) == []


def job_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(run_dir.glob("checkpoints/**/*.safetensors"))
    assert files, "no consolidated weights file"
    return load_file(str(files[-1]))
