"""Scalars from every Weights & Biases run a job logs, read from wandb's own run files.

Scripts from GitHub call ``wandb.init()`` and ``wandb.log()``. A job without a W&B key runs them offline
(worker/launch.py sets ``WANDB_MODE=offline``), and wandb then writes each run to
``wandb/offline-run-*/run-*.wandb`` where the script runs: its transaction log, the file ``wandb sync``
uploads later. Its history records are what ``wandb.log`` logged; they become the job's metrics here, under
wandb's names, at wandb's step (or at the step metric a ``define_metric`` names, as Lightning's and the
Hugging Face Trainer's loggers do, so the x-axis is the one the W&B page would show).

The file is parsed here rather than through the wandb package, so a worker needs none, and the job's own
wandb version does not matter: the framing is LevelDB's log format (32 KiB blocks of chunks, each a CRC32
of its type and data, a length and a type: full, first, middle, last) after a 7-byte header, and each
record is a protobuf ``Record`` whose field numbers are wandb's wire contract (wandb_internal.proto).
A run is read incrementally: a record half-written is left for the next read; what one ``read`` returns is
held until ``ack``, as worker/tb_tail.py does.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jobs.store.ingest_found import MAX_STEP
from worker.run_files import MAX_READ, FileTail, Point, open_in

log = logging.getLogger(__name__)

RUN_FILE_SUFFIX = ".wandb"
FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")  # crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_RECORD = 64 * 1024 * 1024  # a record longer is no history row wandb writes: the file is read no further

# Field numbers of wandb_internal.proto.
RECORD_HISTORY, RECORD_METRIC = 2, 12
HISTORY_ITEM, HISTORY_STEP, STEP_NUM = 1, 2, 1
ITEM_KEY, ITEM_NESTED_KEY, ITEM_VALUE_JSON = 1, 2, 16
METRIC_NAME, METRIC_GLOB, METRIC_STEP_METRIC = 1, 2, 4


class CorruptRun(ValueError):
    """A chunk whose checksum or type is wrong: the rest of that file is not read."""


def records(data: bytes, start: int) -> tuple[list[bytes], int]:
    """The complete records in ``data``, the bytes of a run file from offset ``start`` (just past a record), and
    the offset after the last of them: a record still being written is left for the next call. A damaged chunk
    ends the records returned, and raises CorruptRun once it is the first thing read (pure)."""
    found: list[bytes] = []
    parts: list[bytes] = []
    pos = done = start
    end = start + len(data)
    while True:
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER.size:  # a block's tail too short for a chunk header is padding
            if pos + left > end:
                break
            pos += left
            if not parts:
                done = pos
            continue
        if pos + CHUNK_HEADER.size > end:
            break
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos - start)
        body_at = pos + CHUNK_HEADER.size
        if body_at + length > end:
            break
        body = data[body_at - start:body_at - start + length]
        if kind not in (FULL, FIRST, MIDDLE, LAST) or crc != zlib.crc32(body, zlib.crc32(bytes([kind]))):
            if found:
                break  # the records before the damage first; the next call starts at it
            raise CorruptRun(f"bad chunk at byte {pos}")
        pos = body_at + length
        if kind in (FULL, FIRST):
            parts = [body]
        else:
            parts.append(body)
        if kind in (FULL, LAST):
            found.append(b"".join(parts))
            parts, done = [], pos
    return found, done


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise CorruptRun("varint past the end of a record")
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: an int for a varint, the bytes of anything else (pure)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            value, i = buf[i:i + length], i + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        else:
            raise CorruptRun(f"wire type {wire} in a record")
        yield number, value


def _text(value: int | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


@dataclass
class StepMetrics:
    """``define_metric(name or glob, step_metric=...)``: the metric whose value is another metric's step."""

    exact: dict[str, str] = field(default_factory=dict)
    globs: list[tuple[str, str]] = field(default_factory=list)

    def add(self, record: bytes) -> None:
        name = glob = step_metric = ""
        for number, value in fields(record):
            if number == METRIC_NAME:
                name = _text(value)
            elif number == METRIC_GLOB:
                glob = _text(value)
            elif number == METRIC_STEP_METRIC:
                step_metric = _text(value)
        if step_metric and name:
            self.exact[name] = step_metric
        elif step_metric and glob:
            self.globs.append((glob, step_metric))

    def of(self, name: str) -> str | None:
        if name in self.exact:
            return self.exact[name]
        return next((step for glob, step in reversed(self.globs) if fnmatch.fnmatchcase(name, glob)), None)


def _number(value_json: str) -> float | None:
    try:
        value = json.loads(value_json)
    except ValueError:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # images, histograms, tables, text: not a metric
    return float(value)


def history_points(history: bytes, steps: StepMetrics) -> list[Point]:
    """The scalars of one history record (``wandb.log``'s row), wandb's own ``_step``/``_runtime``/``_timestamp``
    aside (pure)."""
    row: dict[str, float] = {}
    step: int | None = None
    for number, value in fields(history):
        if number == HISTORY_STEP and isinstance(value, bytes):
            step = next((v for n, v in fields(value) if n == STEP_NUM and isinstance(v, int)), step)
        elif number == HISTORY_ITEM and isinstance(value, bytes):
            key, nested, value_json = "", [], ""
            for n, v in fields(value):
                if n == ITEM_KEY:
                    key = _text(v)
                elif n == ITEM_NESTED_KEY:
                    nested.append(_text(v))
                elif n == ITEM_VALUE_JSON:
                    value_json = _text(v)
            name = key or ".".join(nested)  # a nested dict logged as {"a": {"b": 1}} is "a.b" on the W&B page
            parsed = _number(value_json)
            if name and parsed is not None:
                row[name] = parsed
    if step is None:
        step = int(row.get("_step", 0))
    wall = row.get("_timestamp", time.time())
    points = []
    for name, value in row.items():
        if name.startswith("_"):
            continue
        step_metric = steps.of(name)
        at = row.get(step_metric) if step_metric else None
        at_step = int(at) if at is not None and math.isfinite(at) else step
        if 0 <= at_step <= MAX_STEP:
            points.append(Point(name, at_step, value, wall))
    return points


class _Run:
    def __init__(self) -> None:
        self.offset = 0  # before the file header is checked
        self.steps = StepMetrics()
        self.broken = False
        self.window = MAX_READ  # grows while one record is longer than it
        self.size_read = -1  # the file's size at the last read: an unchanged file is not read again

    def read(self, root: Path, path: Path) -> list[Point]:
        with open_in(root, path) as f:
            size = os.fstat(f.fileno()).st_size
            if size == self.size_read:
                return []
            f.seek(self.offset)
            data = f.read(self.window)
        if self.offset == 0:
            if len(data) < len(FILE_HEADER):
                return []
            if not data.startswith(FILE_HEADER):
                raise CorruptRun("not a wandb run file (its header differs)")
            self.offset, data = len(FILE_HEADER), data[len(FILE_HEADER):]
        start = self.offset
        found, self.offset = records(data, start)
        if not found and len(data) >= self.window:  # one record longer than the window: a wider one next time
            self.window *= 2
            if self.window > MAX_RECORD:
                raise CorruptRun(f"a record over {MAX_RECORD >> 20} MiB at byte {start}")
            return []
        self.window = MAX_READ
        if self.offset >= size:
            self.size_read = size  # all of it read; until it grows there is nothing new
        points: list[Point] = []
        for record in found:
            for number, value in fields(record):
                if number == RECORD_METRIC and isinstance(value, bytes):
                    self.steps.add(value)
                elif number == RECORD_HISTORY and isinstance(value, bytes):
                    points.extend(history_points(value, self.steps))
        return points


class WandbTail(FileTail[_Run]):
    """Follows the W&B run files under ``root``; the reader needs nothing a worker could lack."""

    def matches(self, name: str) -> bool:
        return name.endswith(RUN_FILE_SUFFIX)

    def open(self, path: Path) -> _Run:
        return _Run()

    def new_points(self, path: Path, state: _Run) -> list[Point]:
        if state.broken:
            return []
        try:
            return state.read(self.root, path)
        except CorruptRun as exc:
            log.warning("wandb run file %s: %s; the rest of it is not read", path, exc)
            state.broken = True
        except OSError as exc:  # gone or unreadable for now: tried again next tick
            log.debug("wandb run file %s: %s", path, exc)
        return []
