"""GPUs that fail jobs, on real processes: a worker with two simulated GPUs, GPU 0 of which "fails" every rank that
runs on it with an uncorrectable ECC error. After TORCHYARD_GPU_FAULT_LIMIT faults it is quarantined, the job that met
them runs on GPU 1, the next jobs never get GPU 0, and an admin's clear (through the CLI) returns it."""

from __future__ import annotations

import textwrap

import httpx
import pytest
from typer.testing import CliRunner

from tests.helpers import Services, wait_until
from torchyard.cli.main import app

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}
# A rank on GPU 0 meets a device fault while the broken-GPU file exists; elsewhere it succeeds.
ECC = textwrap.dedent("""
    import os, pathlib, sys
    device = os.environ["CUDA_VISIBLE_DEVICES"]
    print(f"visible devices: {device}", flush=True)
    if device == "0" and pathlib.Path(sys.argv[1]).exists():
        print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr, flush=True)
        sys.exit(1)
""")


def submit(client: httpx.Client, broken: str, gpus: int = 1, retries: int = 0) -> str:
    resp = client.post("/v1/jobs", json={"kind": "script", "name": "ecc", "entrypoint": "ecc.py", "args": [broken], "retries": retries,
                                         "parallel": {"nproc_per_node": gpus, "device": "cuda"}})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_a_gpu_that_fails_jobs_is_quarantined_and_never_placed_until_cleared(services: Services) -> None:
    (services.settings.code_dir / "ecc.py").write_text(ECC)
    broken = services.settings.runs_dir.parent / "gpu0-broken"
    broken.touch()
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2", TORCHYARD_GPU_FAULT_LIMIT="2")
    env = {"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": services.headers["Authorization"].removeprefix("Bearer ")}
    with services.client() as client:
        job = submit(client, str(broken), retries=1)
        done = services.wait_status(client, job, TERMINAL, timeout_s=180)
        # Attempt 1 met the fault on GPU 0 (back in line, no retry spent); attempt 2 met it there again (the limit:
        # GPU 0 quarantined; a second fault on the same GPU spends the retry); attempt 3 ran on GPU 1.
        assert done["status"] == "succeeded", done["error"]
        assert [a["placement"][0]["gpus"] for a in done["attempts"]] == [[0], [0], [1]]
        assert [a["error_type"] for a in done["attempts"]] == ["device_fault", "device_fault", None]
        assert done["attempts"][-1]["outcome"] == "succeeded"

        host = client.get("/v1/hosts/gpu-box").json()
        assert [g["state"] for g in host["gpus"]] == ["quarantined", "ready"]
        assert "uncorrectable ECC error" in host["gpus"][0]["reason"]
        assert [(e["kind"], e["gpu"], e["by"]) for e in host["history"]] == [("quarantine", 0, "device-fault")]
        listed = CliRunner().invoke(app, ["hosts"], env=env)
        assert listed.exit_code == 0 and "0:quarantined 1:free" in listed.output, listed.output

        # The next jobs never get GPU 0: one runs on GPU 1, a 2-GPU job waits, saying why.
        single = submit(client, str(broken))
        assert services.wait_status(client, single, TERMINAL, timeout_s=120)["status"] == "succeeded"
        assert "visible devices: 1" in client.get(f"/v1/jobs/{single}/logs", params={"follow": "false"}).text
        pair = submit(client, str(broken), gpus=2)
        waiting = wait_until(lambda: (d := client.get(f"/v1/jobs/{pair}").json())["waiting_reason"] and d, 60,
                             what="the 2-GPU job's reason")
        assert waiting["status"] == "queued" and waiting["waiting_reason"].endswith("1 GPU quarantined on gpu-box"), waiting

        broken.unlink()  # the GPU was replaced
        cleared = CliRunner().invoke(app, ["hosts", "clear", "gpu-box", "0"], env=env)
        assert cleared.exit_code == 0 and "GPU 0: ready" in cleared.output, cleared.output
        assert services.wait_status(client, pair, TERMINAL, timeout_s=120)["status"] == "succeeded"
        assert client.get(f"/v1/jobs/{pair}").json()["placement"][0]["gpus"] == [0, 1]
