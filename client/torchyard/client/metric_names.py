"""Which logged metric a screen shows as a job's loss and eval loss: the SDK's and the Hugging Face Trainer's
``train/loss`` and ``eval/loss``, else Lightning's ``train_loss_step`` / ``train_loss`` and ``val_loss``, else a
plain ``loss`` and ``eval_loss`` / ``val/loss`` (what most scripts, and the Trainer's MLflow logging, call them).
A display mapping only: the metrics keep the names the script logged (``torchyard metrics``, the API).

This is its one home: ``torchyard ls``, ``--follow`` and ``status`` read it here, and the dashboard from
``dashboard/static/metric-names.js``, written from it by ``python -m dashboard.metric_names`` (a test checks the
two agree)."""

from __future__ import annotations

from collections.abc import Mapping

# What a column shows -> the logged names that fill it, the first one present winning.
DISPLAY: dict[str, tuple[str, ...]] = {
    "train/loss": ("train/loss", "train_loss_step", "train_loss", "loss"),
    "eval/loss": ("eval/loss", "val_loss", "eval_loss", "val/loss"),
}


def shown(values: Mapping[str, float], column: str) -> float | None:
    """The value the ``column`` (``train/loss``, ``eval/loss``, or any metric name) shows among ``values``."""
    for name in DISPLAY.get(column, (column,)):
        if name in values:
            return values[name]
    return None
