"""The framework adapters: a real Lightning fit (when Lightning is importable) reports its metrics and
checkpoints through torchyard.report; the value filter keeps numbers only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from torchyard.integrations import numbers

FIT = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torchyard.integrations import LightningCallback

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    trainer = L.Trainer(max_epochs=2, logger=False, callbacks=[LightningCallback(every_n_steps=2), ModelCheckpoint(save_last=True)],
                        enable_model_summary=False, enable_progress_bar=False, accelerator="cpu", devices=1)
    trainer.fit(M(), data)
''')


def test_numbers_keeps_plain_numbers_and_one_element_tensors() -> None:
    assert numbers({"loss": torch.tensor(0.5), "lr": 1e-3, "epoch": 2, "name": "x", "flag": True, "vec": torch.ones(3)}) == {
        "loss": 0.5, "lr": 1e-3, "epoch": 2.0}


@pytest.mark.slow  # torch processes that train: not in the quick loop
def test_lightning_callback_reports_metrics_and_each_saved_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]]), "TORCHYARD_RUN_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", FIT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["type"] == "metric" and "train_loss" in e["values"]]
    assert steps and max(steps) == 16
    saved = [(e["step"], Path(e["path"]).name) for e in events if e["type"] == "checkpoint"]
    assert saved == [(8, "last.ckpt"), (16, "last.ckpt")]  # last.ckpt rewritten each epoch, reported each time


@pytest.mark.slow  # torch processes that train: not in the quick loop
def test_accelerate_tracker_reports_what_accelerator_logs(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    script = textwrap.dedent('''
        from accelerate import Accelerator
        from torchyard.integrations import AccelerateTracker
        accelerator = Accelerator(log_with=[AccelerateTracker()], cpu=True)
        accelerator.init_trackers("probe")
        accelerator.log({"train/loss": 0.25, "note": "text"}, step=7)
        accelerator.end_training()
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]]), "TORCHYARD_RUN_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["values"]) for e in events if e["type"] == "metric"] == [(7, {"train/loss": 0.25})]
