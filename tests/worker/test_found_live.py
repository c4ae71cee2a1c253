"""A script that knows nothing of torchyard, laid out as Lightning lays out its files (a TensorBoard event
file, ``epoch=0-step=N.ckpt`` checkpoints, a ``--ckpt_path`` resume flag), run as a 2-rank job: its metrics
reach the API from its event file, its checkpoints are listed and downloadable, and after the worker is
SIGKILLed the next attempt resumes through ``resume_args`` from the checkpoint it had written."""

from __future__ import annotations

import tarfile
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from tests.worker.frameworks import killed_and_resumed_logs
from torchyard import Client

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import argparse, os, time
    import torch, torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--ckpt_path")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    start = torch.load(args.ckpt_path)["global_step"] if args.ckpt_path else 0
    print(f"rank {rank} starts after step {start} (ckpt_path={args.ckpt_path})", flush=True)
    print(f"accelerate on cpu: {os.environ.get('ACCELERATE_USE_CPU')}", flush=True)
    ckpts = "lightning_logs/version_0/checkpoints"
    if rank == 0:
        os.makedirs(ckpts, exist_ok=True)
        writer = SummaryWriter(f"lightning_logs/version_{os.environ['TORCHYARD_ATTEMPT']}")
    for step in range(start + 1, args.steps + 1):
        value = torch.tensor([1.0 / step])
        dist.all_reduce(value)
        if rank == 0:
            writer.add_scalar("train_loss", value.item() / 2, step)
            writer.flush()
            if step % 5 == 0:
                torch.save({"global_step": step, "state_dict": {}}, f"{ckpts}/epoch=0-step={step}.ckpt")
        time.sleep(0.25)
    if rank == 0:  # a Hugging Face Trainer's layout at the end: trainer_state.json written last
        hf = f"out/checkpoint-{args.steps + 1}"
        os.makedirs(hf, exist_ok=True)
        torch.save({"w": torch.zeros(4)}, f"{hf}/pytorch_model.bin")
        with open(f"{hf}/trainer_state.json", "w") as f:
            f.write('{"global_step": %d}' % (args.steps + 1))
    dist.barrier()
    dist.destroy_process_group()
''')


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def _checkpoints(client: httpx.Client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]


def test_unchanged_script_metrics_checkpoints_and_resume_after_a_worker_kill(services: Services, tmp_path: Path) -> None:
    (services.settings.code_dir / "train_lightning_like.py").write_text(SCRIPT)
    services.start_api()
    first = services.start_worker()
    spec = {"kind": "script", "name": "found", "entrypoint": "train_lightning_like.py", "args": ["--steps", "40"],
            "parallel": {"nproc_per_node": 2}, "resume_args": ["--ckpt_path", "{checkpoint}"]}
    with services.client() as client:
        created = client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        # The first attempt gets no resume arguments, and its checkpoints appear as the script writes them.
        wait_until(lambda: any(c["step"] >= 10 for c in _checkpoints(client, job_id)), 120, what="a checkpoint at step 10")
        services.kill_worker(first)
        services.start_worker()

        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        assert_resumed_after_a_kill(job)
        first, last = killed_and_resumed_logs(job)
        assert "starts after step 0 (ckpt_path=None)" in first
        assert "accelerate on cpu: 1" in first  # a CPU-only placement: what Accelerate and the HF Trainer need
        assert job["transitions"][-1]["reason"] == "torchrun exited 0"  # both ranks formed the group: no warning
        resumed = [line for line in last.splitlines() if "starts after step" in line]
        assert resumed and all("starts after step 0 " not in line for line in resumed), resumed  # not from zero
        assert "lightning_logs/version_0/checkpoints/epoch=0-step=" in last

        attempts = job["attempts"]
        assert attempts[-1]["resumed_from_step"] in range(10, 41, 5)

        # Its TensorBoard scalars, under their own tag, every step once across both attempts.
        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train_loss"}).json()["items"]
        assert [p["step"] for p in points] == list(range(1, 41))
        assert job["last_step"] == 40 and "train_loss" in job["latest_metrics"]

        ckpts = _checkpoints(client, job_id)
        assert [c["step"] for c in ckpts] == [*range(5, 41, 5), 41]
        assert ckpts[-1]["details"]["found"] == "huggingface" and ckpts[-1]["weights_url"] is None
        with Client(services.url, services.headers["Authorization"].removeprefix("Bearer ")) as sdk:
            archive = sdk.download_checkpoint_archive(job_id, 41, tmp_path)
        with tarfile.open(archive) as tar:
            assert sorted(tar.getnames()) == ["checkpoint-41/pytorch_model.bin", "checkpoint-41/trainer_state.json"]
        final = client.get(f"/v1/jobs/{job_id}/checkpoints/40/weights")
        assert final.status_code == 200
        assert final.content == (Path(job["run_dir"]) / "workdir/lightning_logs/version_0/checkpoints/epoch=0-step=40.ckpt").read_bytes()


PLANTS = textwrap.dedent('''
    import os, time
    # Where the worker looks for checkpoints and metric files: FIFOs, which a plain open waits on forever.
    os.makedirs("out/checkpoint-5", exist_ok=True)
    os.mkfifo("out/checkpoint-5/trainer_state.json")
    with open("out/checkpoint-5/model.safetensors", "wb") as f:
        f.write(b"x")
    os.mkfifo("mlflow.db")
    os.makedirs("out/ckpts", exist_ok=True)
    os.mkfifo("out/ckpts/last.ckpt")
    time.sleep(4)  # long enough for the worker's scans to find them settled
    print("planted", flush=True)
''')


def test_a_job_planting_fifos_where_the_worker_reads_neither_hangs_it_nor_lists_them(services: Services) -> None:
    (services.settings.code_dir / "plants.py").write_text(PLANTS)
    (services.settings.code_dir / "after.py").write_text("print('the worker took the next job')\n")
    services.start_api()
    services.start_worker()
    with services.client() as client:
        first = client.post("/v1/jobs", json={"kind": "script", "name": "plants", "entrypoint": "plants.py",
                                              "checkpoint": {"discover": ["out/ckpts/*.ckpt"]}})
        assert first.status_code == 201, first.text
        # A healthy run takes seconds; the deadline is far past it (the worker used to block here for good).
        job = services.wait_status(client, first.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=300)
        assert job["status"] == "succeeded", job["error"]
        assert _checkpoints(client, job["id"]) == []
        after = client.post("/v1/jobs", json={"kind": "script", "name": "after", "entrypoint": "after.py"})
        assert after.status_code == 201, after.text
        done = services.wait_status(client, after.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=300)
        assert done["status"] == "succeeded", done["error"]
