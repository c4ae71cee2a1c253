"""An Accelerate script, unchanged, as a 2-rank CPU script job: ``log_with="tensorboard"`` metrics in the API, its
``save_state`` directories listed and downloadable, and after the worker is SIGKILLed the next attempt resumes
through ``resume_args`` (``--resume``), as Accelerate's own examples do. Runs where Accelerate is installed (the
``test`` extra pins it)."""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import Services
from tests.worker.frameworks import archive_names, checkpoints, killed_and_resumed, killed_and_resumed_logs, ranks_path

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import argparse, os, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save_every", type=int, default=4)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()

    accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
    accelerator.init_trackers("regression")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=16)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    accelerator.print(f"num_processes={accelerator.num_processes}")

    step = 0
    if args.resume:
        accelerator.load_state(args.resume)
        step = int(os.path.basename(args.resume.rstrip("/")).split("_")[-1])  # as Accelerate's examples do
        accelerator.print(f"resumed from {args.resume} at step {step}")
    while step < args.steps:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            accelerator.log({"train_loss": loss.item()}, step=step)
            # The test kills the first attempt once step 8's checkpoint is listed: slower from there, so the kill
            # lands mid-job on a loaded machine (0.15 s a step left 2.4 s).
            time.sleep(1.0 if os.environ.get("TORCHYARD_ATTEMPT") == "1" and step >= 8 else 0.15)
            if step % args.save_every == 0:
                accelerator.save_state(f"ckpt/step_{step}")
            if step >= args.steps:
                break
    accelerator.end_training()
''')
STEPS, SAVE_EVERY = 24, 4


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_accelerate_script_unchanged_metrics_checkpoints_and_resume(services: Services) -> None:
    accelerate = pytest.importorskip("accelerate")
    spec = {"name": "acc", "args": ["--steps", str(STEPS), "--save_every", str(SAVE_EVERY)],
            "resume_args": ["--resume", "{checkpoint}"]}
    with killed_and_resumed(services, SCRIPT, spec, 2 * SAVE_EVERY, ranks_path(accelerate)) as (client, job):
        job_id = job["id"]
        first, second = killed_and_resumed_logs(job)
        assert "num_processes=2" in first and "num_processes=1" not in first  # distributed on CPUs, not two lone ranks
        resumed = job["attempts"][-1]["resumed_from_step"]
        assert resumed >= 2 * SAVE_EVERY and f"at step {resumed}" in second, second[-2000:]  # Accelerate's own load_state

        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train_loss"}).json()["items"]
        assert points and max(p["step"] for p in points) == STEPS
        steps = sorted({c["step"] for c in checkpoints(client, job_id)})
        assert STEPS in steps and all(s % SAVE_EVERY == 0 for s in steps), steps
        names = archive_names(client, job_id, STEPS)
        assert any(n.endswith("model.safetensors") for n in names) and any(n.endswith("random_states_1.pkl") for n in names)
