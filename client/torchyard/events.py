"""events.jsonl: the trainer's only channel to the worker. Written by global rank 0 alone."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchyard.sinks import SinkRunner

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"


def _seq_of(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["seq"])
    except (ValueError, KeyError, TypeError):
        return None


def last_seq(path: Path) -> int:
    """The highest seq already in the file, 0 when none; a torn last line is ignored.

    Read backwards in blocks until the last complete line that carries a seq (seq only grows): one
    line longer than a block (a large status event) is joined across blocks, never misread as none."""
    if not path.exists():
        return 0
    block = 65536
    with path.open("rb") as f:
        pos = f.seek(0, os.SEEK_END)
        carry = b""  # the start of a line cut by the block boundary, completed by the next block back
        while pos > 0:
            size = min(block, pos)
            pos -= size
            f.seek(pos)
            lines = (f.read(size) + carry).split(b"\n")
            carry = lines.pop(0) if pos > 0 else b""
            for line in reversed(lines):
                seq = _seq_of(line) if line.strip() else None
                if seq is not None:
                    return seq
        seq = _seq_of(carry) if carry.strip() else None
    return seq or 0


def _ends_torn(path: Path) -> bool:
    with path.open("rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; a diverged loss is reported as null instead of breaking the reader.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class EventWriter:
    """Appends one JSON object per line, flushed per line. A no-op on every rank but global 0.

    ``sinks`` (TensorBoard, MLflow) get every metric and weights file too, queued for their own thread."""

    def __init__(self, run_dir: Path, enabled: bool, sinks: SinkRunner | None = None):
        self.enabled = enabled
        self.sinks = sinks if enabled else None
        # Called before every event is written, so a report still in flight (trainer.metrics) is written first.
        self.before_emit: Callable[[], Any] | None = None
        self._file = None
        self._seq = 0
        if enabled:
            path = run_dir / EVENTS_FILE
            self._seq = last_seq(path)
            self._file = path.open("a", encoding="utf-8")
            if _ends_torn(path):
                # A crash mid-write left a partial line: end it, so the next event starts on its own line
                # (readers skip the unparsable fragment) instead of being glued onto it.
                self._file.write("\n")
                self._file.flush()

    def emit(self, type_: str, **fields: Any) -> None:
        if not self.enabled or self._file is None:
            return
        if self.before_emit is not None:
            hook, self.before_emit = self.before_emit, None  # the hook's own event must not call it again
            try:
                hook()
            finally:
                self.before_emit = hook
        self._seq += 1
        record = {"seq": self._seq, "time": time.time(), "type": type_, **_clean(fields)}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        if self.sinks is not None:
            if type_ == "metric":
                self.sinks.put(record["step"], record["values"])
            elif type_ == "checkpoint" and isinstance(fields.get("weights"), str):
                self.sinks.note_weights(fields["weights"])

    def settle(self) -> None:
        """Write a report still in flight now. Called before a checkpoint becomes the one to resume from: a kill
        after that point must not take with it a step the next attempt will not train again."""
        if self.enabled and self._file is not None and self.before_emit is not None:
            self.before_emit()

    def metric(self, step: int, epoch: int, values: dict[str, float]) -> None:
        self.emit("metric", step=step, epoch=epoch, values=values)

    def status(self, phase: str, **extra: Any) -> None:
        self.emit("status", phase=phase, **extra)

    def checkpoint(self, step: int, epoch: int, path: str, **extra: Any) -> None:
        self.emit("checkpoint", step=step, epoch=epoch, path=path, **extra)

    def close(self) -> None:
        if self._file is not None and self.before_emit is not None:
            self.before_emit()  # a report still in flight is written, not lost, at exit or preemption
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.sinks is not None:
            self.sinks.close()  # drains and flushes: the event files are complete when the job ends
