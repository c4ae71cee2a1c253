"""What the live framework tests share: an unchanged script put in the code root, run as a 2-rank CPU job, the
worker SIGKILLed once the framework has saved, a new worker that resumes it through ``resume_args``, and the
job's metrics, checkpoints and downloads read back through the API."""

from __future__ import annotations

import io
import json
import os
import tarfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.helpers import ROOT, Services, assert_resumed_after_a_kill, wait_until

# A nanoGPT-shaped train.py: out/ckpt.pt (a dict holding iter_num) every 10 iters, --init_from=resume reads it back.
NANOGPT_TRAIN = textwrap.dedent('''
    import os, sys, time
    import torch
    from torch.utils.tensorboard import SummaryWriter

    init_from = "scratch"
    for arg in sys.argv[1:]:  # nanoGPT's configurator: --key=value overrides
        key, value = arg.removeprefix("--").split("=", 1)
        globals()[key] = value
    max_iters, out_dir = 40, "out"
    if os.environ.get("APP_FAIL_FIRST") and os.environ["TORCHYARD_ATTEMPT"] == "1":
        sys.exit("failing before any checkpoint")
    iter_num = 0
    if init_from == "resume":
        iter_num = torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)["iter_num"]
    print(f"starting at iter {iter_num} (init_from={init_from})", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    writer = SummaryWriter(f"tb/attempt{os.environ['TORCHYARD_ATTEMPT']}")
    while iter_num < max_iters:
        iter_num += 1
        t0 = time.time()
        writer.add_scalar("loss", 1.0 / iter_num, iter_num)
        writer.flush()
        dt = time.time() - t0
        print(f"iter {iter_num}: loss {1.0 / iter_num:.4f}, time {dt*1000:.2f}ms, mfu {-100.0:.2f}%", flush=True)  # nanoGPT's line
        if iter_num % 10 == 0:
            torch.save({"model": {"w": torch.zeros(4)}, "iter_num": iter_num, "best_val_loss": 1.0},
                       os.path.join(out_dir, "ckpt.pt"))
        time.sleep(0.5)
''')


# A LightningModule the Lightning scripts share; each script defines ``pace(global_step)``, called every step.
LIGHTNING_REGRESSION = textwrap.dedent('''
    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            pace(self.global_step)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)
''')

LOGGED_STEPS = 3 * 4  # lightning_logging()'s run: 3 epochs of 256 samples / 2 ranks / batch 32


def lightning_logging(imports: str, logger: str) -> str:
    """A 2-rank Lightning DDP regression of LOGGED_STEPS steps that logs ``train_loss`` every 2nd step through
    ``logger`` (an expression, after ``imports``)."""
    return textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import lightning.pytorch as L

        def pace(global_step):
            pass
    ''') + textwrap.dedent(imports) + LIGHTNING_REGRESSION + textwrap.dedent(f'''
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
        trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=2, strategy="ddp", log_every_n_steps=2,
                            logger={logger}, enable_checkpointing=False)
        trainer.fit(Regression(), DataLoader(data, batch_size=32))
    ''')


def ranks_path(*modules: ModuleType) -> str:
    """PYTHONPATH for the worker's ranks: torchyard, then where each framework is installed."""
    sites = [str(Path(m.__file__ or "").resolve().parents[m.__name__.count(".") + 1]) for m in modules]
    return os.pathsep.join(dict.fromkeys([str(ROOT), *sites]))


def ddp_regression(tracker: str, begin: str, log: str, end: str, steps: int = 20) -> str:
    """A plain 2-rank DDP regression script of ``steps`` steps that imports ``tracker`` and runs, on rank 0 only,
    ``begin`` before its loop, ``log`` at each step (``step`` and ``loss`` in scope) and ``end`` after it; rank 0 then
    writes every loss to losses.json."""
    def block(code: str, indent: str) -> str:
        return textwrap.indent(textwrap.dedent(code).strip(), indent)

    return textwrap.dedent('''
        import json
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        import {tracker}

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
        y = x.sum(dim=1, keepdim=True)
        losses = []
        if rank == 0:
        {begin}
        for step in range({steps}):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if rank == 0:
        {log}
        if rank == 0:
        {end}
            with open("losses.json", "w") as f:
                json.dump(losses, f)
        dist.destroy_process_group()
    ''').format(tracker=tracker, steps=steps, begin=block(begin, "    "), log=block(log, "        "),
                 end=block(end, "    "))


def rank_logs(run_dir: Path, attempt: int) -> str:
    return "\n".join(f.read_text(errors="replace") for f in sorted((run_dir / "logs" / f"attempt-{attempt}").rglob("*.log")))


def killed_and_resumed_logs(job: dict[str, Any]) -> tuple[str, str]:
    """The rank logs of the attempt the worker kill ended (the first that ran: a placement that lapsed on a busy
    machine before it started has none) and of the last, which resumed."""
    run_dir = Path(job["run_dir"])
    first = next((logs for a in range(1, job["attempt"]) if (logs := rank_logs(run_dir, a))), "")
    return first, rank_logs(run_dir, job["attempt"])


def checkpoints(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    return client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]


@contextmanager
def killed_and_resumed(services: Services, script: str, spec: dict[str, Any], saved_step: int, pythonpath: str,
                       timeout_s: float = 600) -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    """Run ``script`` (as ``train.py``) under ``spec``; once a checkpoint of at least ``saved_step`` is listed, SIGKILL
    the worker and start another. Yields an API client and the finished job, asserted resumed after the kill.
    ``timeout_s`` is far past a healthy run: a job whose requirements build its environment first took over 300 s
    to its first checkpoint with a second suite beside it."""
    (services.settings.code_dir / "train.py").write_text(script)
    services.start_api()
    first = services.start_worker(PYTHONPATH=pythonpath)
    with services.client() as client:
        created = client.post("/v1/jobs", json={"kind": "script", "entrypoint": "train.py",
                                                "parallel": {"nproc_per_node": 2}, **spec})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        wait_until(lambda: any(c["step"] >= saved_step for c in checkpoints(client, job_id)), timeout_s,
                   what=f"a checkpoint at step {saved_step}")
        services.kill_worker(first)
        services.start_worker(PYTHONPATH=pythonpath)
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=timeout_s)
        logs = rank_logs(Path(job["run_dir"]), job["attempt"]) if job.get("run_dir") else ""
        assert job["status"] == "succeeded", (job["error"], logs[-3000:])
        assert_resumed_after_a_kill(job)
        assert job["transitions"][-1]["reason"] == "torchrun exited 0"  # one process group of 2: no warning
        yield client, job


def submit_script(client: httpx.Client, name: str, entrypoint: str) -> str:
    """A 2-rank script job of ``entrypoint`` in the code root; its id."""
    created = client.post("/v1/jobs", json={"kind": "script", "name": name, "entrypoint": entrypoint,
                                            "parallel": {"nproc_per_node": 2}})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def wait_succeeded(services: Services, client: httpx.Client, job_id: str) -> dict[str, Any]:
    """The job once it has ended, asserted to have succeeded (its ranks' logs in the message when not)."""
    job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=600)
    logs = rank_logs(Path(job["run_dir"]), job["attempt"]) if job.get("run_dir") else ""
    assert job["status"] == "succeeded", (job["error"], logs[-3000:])
    return job


@contextmanager
def plain_and_lightning_jobs(services: Services, plain: str, lightning: str,
                             *modules: ModuleType) -> Iterator[tuple[httpx.Client, dict[str, dict[str, Any]]]]:
    """Run ``plain`` (``ddp_regression``) and ``lightning`` (``lightning_logging``) as 2-rank script jobs on one worker
    whose ranks import ``modules``; yields an API client and both finished jobs, asserted succeeded, by name."""
    (services.settings.code_dir / "plain.py").write_text(plain)
    (services.settings.code_dir / "lit.py").write_text(lightning)
    services.start_api()
    services.start_worker(PYTHONPATH=ranks_path(*modules))
    with services.client() as client:
        ids = {name: submit_script(client, name, f"{name}.py") for name in ("plain", "lit")}
        yield client, {name: wait_succeeded(services, client, job_id) for name, job_id in ids.items()}


def assert_the_plain_scripts_metrics(client: httpx.Client, job: dict[str, Any], steps: int = 20) -> None:
    """What a ``ddp_regression`` script of the tracker tests logs, as the job's metrics: ``train/loss`` is every loss
    it saw, at steps 0.., falling tenfold; ``scale`` a gap at step 5, where it was NaN; ``lr`` at every step."""
    logged = json.loads((Path(job["run_dir"]) / "workdir" / "losses.json").read_text())
    assert metric_points(client, job["id"], "train/loss") == pytest.approx(list(enumerate(logged)))
    assert logged[-1] < logged[0] / 10
    assert metric_points(client, job["id"], "scale") == [(step, 1.0) for step in range(steps) if step != 5]
    assert metric_points(client, job["id"], "lr") == [(step, 0.1) for step in range(steps)]


def metric_points(client: httpx.Client, job_id: str, name: str) -> list[tuple[int, float]]:
    items = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": name}).json()["items"]
    return [(p["step"], p["value"]) for p in items]


def archive_names(client: httpx.Client, job_id: str, step: int) -> list[str]:
    """The member names of a directory checkpoint downloaded as one tar."""
    got = client.get(f"/v1/jobs/{job_id}/checkpoints/{step}/archive")
    assert got.status_code == 200, got.text
    with tarfile.open(fileobj=io.BytesIO(got.content)) as tar:
        return tar.getnames()
