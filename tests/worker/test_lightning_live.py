"""A Lightning script, unchanged, as a 2-rank CPU script job: TensorBoardLogger and ModelCheckpoint as a
user writes them, metrics from its event files in the API, its checkpoints listed and downloadable, and
after the worker is SIGKILLed the next attempt resumes through ``resume_args`` (``--ckpt_path``); and
what its CSVLogger writes instead, as the job's metrics. Runs where Lightning is installed (the ``test`` extra pins
it)."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pytest

from tests.helpers import Services
from tests.worker.frameworks import (
    LIGHTNING_REGRESSION,
    LOGGED_STEPS,
    checkpoints,
    killed_and_resumed,
    killed_and_resumed_logs,
    lightning_logging,
    metric_points,
    ranks_path,
    submit_script,
    wait_succeeded,
)

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import argparse, os, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    def pace(global_step):
        # The test kills the first attempt once step 8's checkpoint is listed: slower from there, so the kill
        # lands mid-job on a loaded machine (0.15 s a step left 2.4 s).
        first = os.environ.get("TORCHYARD_ATTEMPT") == "1" and global_step >= 8
        time.sleep(1.0 if first else 0.15)
''') + LIGHTNING_REGRESSION + textwrap.dedent('''
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--ckpt_path", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=2, strategy="ddp", log_every_n_steps=2,
                        logger=TensorBoardLogger("."), callbacks=[ModelCheckpoint(save_top_k=-1, save_last=True)])
    trainer.fit(Regression(), DataLoader(data, batch_size=32), ckpt_path=args.ckpt_path)
''')
STEPS_PER_EPOCH = 4  # 256 samples / 2 ranks / batch 32
CSV_LOGGING = lightning_logging("from lightning.pytorch.loggers import CSVLogger", 'CSVLogger(".")')


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_lightning_script_unchanged_metrics_checkpoints_and_resume(services: Services) -> None:
    lightning = pytest.importorskip("lightning")
    spec = {"name": "lit", "args": ["--epochs", "6"], "resume_args": ["--ckpt_path", "{checkpoint}"]}
    with killed_and_resumed(services, SCRIPT, spec, 2 * STEPS_PER_EPOCH, ranks_path(lightning)) as (client, job):
        job_id = job["id"]
        _, second = killed_and_resumed_logs(job)
        assert "Restoring states from the checkpoint path at" in second  # Lightning's own resume, from --ckpt_path
        assert job["attempts"][-1]["resumed_from_step"] >= 2 * STEPS_PER_EPOCH

        total = 6 * STEPS_PER_EPOCH
        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train_loss"}).json()["items"]
        assert points and max(p["step"] for p in points) >= total - 2  # Lightning logs every 2nd step
        steps = [c["step"] for c in checkpoints(client, job_id)]
        assert total in steps and all(s % STEPS_PER_EPOCH == 0 for s in steps)
        final = client.get(f"/v1/jobs/{job_id}/checkpoints/{total}/weights")
        assert final.status_code == 200 and len(final.content) > 0


def test_what_lightnings_csv_logger_writes_is_the_jobs_metrics(services: Services) -> None:
    lightning = pytest.importorskip("lightning")
    (services.settings.code_dir / "csv_logging.py").write_text(CSV_LOGGING)
    services.start_api()
    services.start_worker(PYTHONPATH=ranks_path(lightning))
    with services.client() as client:
        job = wait_succeeded(services, client, submit_script(client, "csv", "csv_logging.py"))
        # CSVLogger flushes every 100 steps: this run's file is written once, as the ranks end, and read after them.
        written = Path(job["run_dir"]) / "workdir" / "lightning_logs" / "version_0" / "metrics.csv"
        with open(written, newline="") as f:
            logged = [(int(row["step"]), float(row["train_loss"])) for row in csv.DictReader(f) if row["train_loss"]]
        assert [step for step, _ in logged] == list(range(1, LOGGED_STEPS, 2))
        assert metric_points(client, job["id"], "train_loss") == logged
