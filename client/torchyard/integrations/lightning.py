"""``Trainer(callbacks=[LightningCallback()])``: Lightning's logged metrics into torchyard, every
``every_n_steps`` optimizer steps and at each epoch's end, and every checkpoint ModelCheckpoint saved.

Lightning runs ModelCheckpoint after every other callback of the same hook, so a save is reported from
the next hook (the next batch or epoch starting, or training ending), when its file is complete."""

from __future__ import annotations

import os
import re
from typing import Any

from torchyard import report
from torchyard.integrations import numbers

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback  # type: ignore[no-redef]


class LightningCallback(Callback):  # type: ignore[misc]
    def __init__(self, every_n_steps: int = 10):
        self.every_n_steps = every_n_steps
        self._reported: dict[str, float] = {}  # path -> mtime reported (last.ckpt is rewritten in place)

    def _metrics(self, trainer: Any) -> None:
        values = numbers(dict(trainer.callback_metrics))
        if values:
            report.metrics(int(trainer.global_step), values, epoch=int(trainer.current_epoch))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._metrics(trainer)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._metrics(trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._checkpoints(trainer)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._checkpoints(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._checkpoints(trainer)

    def _checkpoints(self, trainer: Any) -> None:
        for callback in getattr(trainer, "checkpoint_callbacks", []):
            path = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
            mtime = os.path.getmtime(path) if path and os.path.isfile(path) else None
            if mtime is not None and self._reported.get(path) != mtime:
                self._reported[path] = mtime
                named = re.search(r"step=(\d+)", os.path.basename(path))
                report.checkpoint(path, int(named.group(1)) if named else int(trainer.global_step), epoch=int(trainer.current_epoch))
