"""Rank 0's scalars as a TensorBoard event file under ``artifacts/tensorboard/``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.sinks.base import Point

LOGDIR = "artifacts/tensorboard"


class TensorBoardSink:
    """Every metric as a scalar, at the step it was reported, with the value events.jsonl holds."""

    name = "tensorboard"

    def __init__(self, run_dir: Path):
        # Imported on the caller's thread, once, before training: an import on the sink thread can race the
        # interpreter's shutdown when a short script ends (imports that register atexit hooks then fail).
        from torch.utils.tensorboard import SummaryWriter

        self._writer_class = SummaryWriter
        self.logdir = run_dir / LOGDIR
        self._writer: Any = None

    def open(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = self._writer_class(str(self.logdir), flush_secs=10)

    def write(self, points: Sequence[Point]) -> None:
        for step, values in points:
            for name, value in values.items():
                self._writer.add_scalar(name, math.nan if value is None else float(value), global_step=step)

    def close(self, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
