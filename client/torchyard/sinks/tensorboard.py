"""Rank 0's scalars as a TensorBoard event file under ``artifacts/tensorboard/``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchyard.sinks.base import Point

LOGDIR = "artifacts/tensorboard"


class TensorBoardSink:
    """Every metric as a scalar, at the step it was reported, with the value events.jsonl holds.

    One TensorBoard event per report, holding all of its scalars, in the format ``SummaryWriter.add_scalar``
    writes (a ``simple_value`` per tag): ``add_scalar`` builds a summary, an event and a queue entry per value,
    and a report carries a dozen values. On a small model reporting every few milliseconds, that Python work
    on this thread took the interpreter lock from the training step often enough to cost the step about 8%
    on one rank (docs/BENCHMARKS.md, "Training throughput")."""

    name = "tensorboard"

    def __init__(self, run_dir: Path):
        # Imported on the caller's thread, once, before training: an import on the sink thread can race the
        # interpreter's shutdown when a short script ends (imports that register atexit hooks then fail).
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter

        self._writer_class = FileWriter
        self._summary = Summary
        self.logdir = run_dir / LOGDIR
        self._writer: Any = None

    def open(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = self._writer_class(str(self.logdir), flush_secs=10)

    def write(self, points: Sequence[Point]) -> None:
        value = self._summary.Value
        for step, values in points:
            scalars = [value(tag=name, simple_value=math.nan if v is None else float(v)) for name, v in values.items()]
            self._writer.add_summary(self._summary(value=scalars), global_step=step)

    def close(self, failed: bool = False) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
