"""Epoch cadence under real torchrun (2 ranks, gloo): eval and checkpoints every N epochs, and the
epoch-average loss, which survives a resume in the middle of an epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import events, run_cases, spec, train_losses

pytestmark = pytest.mark.slow

DATA = {"name": "synthetic-classification", "args": {"samples": 128, "eval_samples": 32, "features": 16}}
STEPS_PER_EPOCH = 4  # 128 samples / global batch 32


def _job(checkpoint: dict, eval_: dict) -> dict:
    job = spec("epochs", data=DATA, epochs=3, checkpoint={"keep_last": 10, **checkpoint})
    job["eval"] = eval_
    return job


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("epochs")
    by_epoch = _job({"every_epochs": 2}, {"every_epochs": 1})
    by_step = _job({"every_steps": 2}, {})
    run_cases(tmp, 2, [
        {"spec": by_epoch, "run_dir": str(tmp / "by-epoch")},
        {"spec": by_step, "run_dir": str(tmp / "by-step")},
        # Resumed at step 6, half-way through the second epoch.
        {"spec": by_step, "run_dir": str(tmp / "resumed"), "resume_from": str(tmp / "by-step" / "checkpoints" / "step_00000006")},
    ])
    return tmp


def _metric_steps(run_dir: Path, name: str) -> dict[int, float]:
    return {e["step"]: e["values"][name] for e in events(run_dir) if e["type"] == "metric" and name in e["values"]}


def test_eval_and_checkpoints_follow_the_epoch_cadence(runs: Path) -> None:
    run = runs / "by-epoch"
    assert sorted(_metric_steps(run, "eval/loss")) == [4, 8, 12]  # after every epoch
    assert [e["step"] for e in events(run) if e["type"] == "checkpoint"] == [8, 12]  # every 2nd epoch, and the end
    assert sorted(_metric_steps(runs / "by-step", "eval/loss")) == [12]  # only at the end without a cadence


def test_epoch_loss_is_the_mean_of_the_epochs_steps_and_survives_a_resume(runs: Path) -> None:
    losses = train_losses(runs / "by-epoch")
    epoch_loss = _metric_steps(runs / "by-epoch", "train/epoch_loss")
    assert sorted(epoch_loss) == [4, 8, 12]
    for end in epoch_loss:
        mean = sum(losses[s] for s in range(end - STEPS_PER_EPOCH + 1, end + 1)) / STEPS_PER_EPOCH
        assert epoch_loss[end] == pytest.approx(mean, abs=1e-6)
    assert epoch_loss[12] < epoch_loss[4]
    resumed = _metric_steps(runs / "resumed", "train/epoch_loss")
    assert sorted(resumed) == [8, 12]  # it started in epoch 2, whose first half ran before the stop
    for end in resumed:
        assert resumed[end] == pytest.approx(epoch_loss[end], abs=1e-6)
