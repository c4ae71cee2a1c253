"""Metrics a script logs with ``mlflow.log_metric`` and no tracking server: MLflow's local stores.

MLflow 3 writes to ``sqlite:///mlflow.db`` in the working directory when no tracking URI is set (the operator's
``TORCHYARD_MLFLOW_TRACKING_URI`` sets one); MLflow 2 (and 3 before 3.7, or Lightning's ``MLFlowLogger()``) writes
the file store, ``mlruns/<experiment>/<run>/metrics/<name>``, a line ``timestamp value step`` per value, which
``MlflowFilesTail`` follows as the other tails follow theirs. The worker follows every SQLite file the job writes (``*.db``,
``*.sqlite``, ``*.sqlite3``) and reads the ``metrics`` table of those that are MLflow stores, from the row after the
last one it read. The file is the job's: the worker copies its bytes through one no-follow descriptor and a child
process with no rights parses them (worker/mlflow_read.py). A copy is kept only when no write overlapped it (no
rollback journal before or after, the same change counter at its start and end); a WAL-mode store is read once
MLflow has checkpointed it, at the latest when it closes. Each read costs a Python start, so a store is read at most
every ``read_s`` seconds, and once more when the ranks have ended.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from jobs.store.ingest_found import MAX_STEP
from worker.run_files import MAX_FILES, FileTail, Listing, Point, open_in

log = logging.getLogger(__name__)

DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")
READ_S = 5.0  # at most one read of a store this often while the job runs
MAX_DB = 1 << 30  # a larger store stops being read (and says so in the log)
ROWS_PER_READ = 20_000
READ_TIMEOUT_S = 60.0
_COUNTER = slice(24, 28)  # the header's file change counter: every committed write in rollback mode changes it


class NotReadable(Exception):
    """This file will not be read again: too large, or its reader failed in a way another try would repeat."""


@dataclass
class StepNumbers:
    """Steps for rows logged without one. MLflow stores such a value at step 0, so a script calling
    ``mlflow.log_metric("loss", x)`` in its loop leaves every value at step 0; such a series (one run and name whose
    every row so far is at step 0) is numbered by order instead: its nth value is step n - 1. A series with any
    other step keeps the steps it logged from there on."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    explicit: set[tuple[str, str]] = field(default_factory=set)

    def step(self, run: str, key: str, logged: int) -> int:
        series = (run, key)
        seen = self.counts.get(series, 0)
        self.counts[series] = seen + 1
        if logged != 0:
            self.explicit.add(series)
        return logged if series in self.explicit else seen


def points_of(rows: Iterable[list], steps: StepNumbers) -> list[Point]:
    """Rows ``[rowid, run, key, value, step, timestamp_ms, is_nan]`` as points (pure but for ``steps``); a NaN is a
    value MLflow stored as 0 with ``is_nan`` set, and comes back as NaN (a gap, jobs/store/ingest_found.py)."""
    points = []
    for row in rows:
        try:  # the reader's output is checked like any input: a row of another shape is skipped
            _, run, key, value, logged, stamp, is_nan = row
            value, logged, stamp = float(value), int(logged), float(stamp)
        except (TypeError, ValueError, OverflowError):
            continue
        if not isinstance(run, str) or not isinstance(key, str):
            continue
        step = steps.step(run, key, logged)
        if 0 <= step <= MAX_STEP:
            points.append(Point(key, step, math.nan if is_nan else value, stamp / 1000.0))
    return points


@dataclass
class _Store:
    after: int = 0  # the last rowid read
    seen: tuple[int, int, bytes] | None = None  # size, mtime and change counter at the last complete read
    next_read: float = 0.0
    steps: StepNumbers = field(default_factory=StepNumbers)
    done: bool = False  # not readable for good


def snapshot(root: Path, path: Path, seen: tuple[int, int, bytes] | None) -> tuple[bytes, tuple[int, int, bytes]] | None:
    """The store's bytes as of one committed state, with what identifies that state; None when nothing changed since
    ``seen`` or a write overlapped the copy (the next read tries again)."""
    journal, wal = path.with_name(path.name + "-journal"), path.with_name(path.name + "-wal")
    if journal.exists() or (wal.exists() and wal.stat().st_size > 0):
        return None
    with open_in(root, path) as f:
        st = os.fstat(f.fileno())
        if st.st_size > MAX_DB:
            raise NotReadable(f"larger than {MAX_DB >> 20} MiB")
        head = os.pread(f.fileno(), 100, 0)
        state = (st.st_size, st.st_mtime_ns, head[_COUNTER])
        if state == seen:
            return None
        data = f.read(MAX_DB + 1)
        after = os.pread(f.fileno(), 100, 0)
    if journal.exists() or data[_COUNTER] != after[_COUNTER] or data[:100] != head:
        return None
    return data, state


def read_rows(data: bytes, after: int, limit: int = ROWS_PER_READ) -> dict:
    """What worker/mlflow_read.py says of ``data``; NotReadable when it failed or said nothing."""
    cmd = [sys.executable, "-I", "-m", "worker.mlflow_read", str(after), str(limit), str(len(data))]
    try:
        done = subprocess.run(cmd, input=data, capture_output=True, env={}, timeout=READ_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise NotReadable(f"its reader ran past {READ_TIMEOUT_S:.0f} s") from exc
    try:
        result = json.loads(done.stdout)
    except ValueError as exc:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise NotReadable(f"its reader failed: {why[0]}") from exc
    return result


class MlflowTail(FileTail[_Store]):
    """Follows the MLflow SQLite stores under ``root``."""

    def __init__(self, root: Path, rescan_s: float, read_s: float = READ_S):
        super().__init__(root, rescan_s)
        self.read_s = read_s
        self._final = False

    def matches(self, name: str) -> bool:
        return name.endswith(DB_SUFFIXES)

    def open(self, path: Path) -> _Store:
        return _Store()

    def read(self, force_scan: bool = False, listing: Listing | None = None) -> list[Point]:
        self._final = force_scan  # the last read of an attempt reads every store, whenever it was last read
        return super().read(force_scan, listing)

    def new_points(self, path: Path, state: _Store) -> list[Point]:
        now = time.monotonic()
        if state.done or (now < state.next_read and not self._final):
            return []
        state.next_read = now + self.read_s
        try:
            copy = snapshot(self.root, path, state.seen)
            if copy is None:
                return []
            data, seen = copy
            result = read_rows(data, state.after)
        except NotReadable as exc:
            log.warning("%s: %s; it is not read again", path, exc)
            state.done = True
            return []
        except OSError as exc:  # gone, or a link put in its place: tried again at the next read
            log.debug("%s: %s", path, exc)
            return []
        if "error" in result:  # a damaged or half-written copy: the next one may read
            log.debug("%s: %s", path, result["error"])
            return []
        if not result.get("mlflow"):  # another database, or a store MLflow is still creating: read again when it changes
            state.seen = seen
            return []
        state.after = int(result["last"])
        if result["more"]:
            state.next_read = now  # more rows than one read returns: the rest at the next tick
        else:
            state.seen = seen
        return points_of(result["rows"], state.steps)


MAX_LINE_READ = 1 << 20  # bytes of a metric file read per tick; the rest at the next


@dataclass
class _MetricFile:
    run: str
    key: str
    offset: int = 0
    steps: StepNumbers = field(default_factory=StepNumbers)
    broken: bool = False


def file_rows(data: bytes, run: str, key: str) -> tuple[list[list], int]:
    """The complete lines of a file-store metric file as rows (the SQLite store's shape) and how many bytes they
    took; a line cut short is left for the next read, a malformed one skipped (pure)."""
    end = data.rfind(b"\n") + 1
    rows = []
    for line in data[:end].split(b"\n"):
        parts = line.split()
        if len(parts) not in (2, 3):  # MLflow before 1.0 wrote no step
            continue
        try:
            stamp, value, step = int(parts[0]), float(parts[1]), int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            continue
        rows.append([0, run, key, value, step, stamp, math.isnan(value)])
    return rows, end


class MlflowFilesTail(FileTail[_MetricFile]):
    """Follows the metric files of MLflow file stores under ``root``: a run is a directory holding ``meta.yaml`` and
    ``metrics/``, and a metric's name is its file's path under ``metrics/`` (``train/loss``)."""

    def matches(self, name: str) -> bool:
        return name == "meta.yaml"  # a run's: its metric files are under the metrics/ beside it

    def candidates(self, listing: Listing) -> list[Path]:
        found: list[Path] = []
        for meta in listing.matching(self.matches):
            metrics = meta.parent / "metrics"
            found.extend(listing.under(metrics, limit=MAX_FILES - len(found)))  # the walk did not enter a linked one
            if len(found) >= MAX_FILES:
                break
        return found

    def open(self, path: Path) -> _MetricFile:
        # The run's own metrics/ (beside its meta.yaml): a name may hold "metrics" too ("val/metrics/acc").
        metrics = next(p for p in path.parents if p.name == "metrics" and (p.parent / "meta.yaml").is_file())
        return _MetricFile(run=metrics.parent.name, key=path.relative_to(metrics).as_posix())

    def new_points(self, path: Path, state: _MetricFile) -> list[Point]:
        if state.broken:
            return []
        try:
            with open_in(self.root, path) as f:
                f.seek(state.offset)
                data = f.read(MAX_LINE_READ)
        except OSError as exc:  # gone, or a link put in its place: tried again next tick
            log.debug("%s: %s", path, exc)
            return []
        rows, used = file_rows(data, state.run, state.key)
        if not used and len(data) >= MAX_LINE_READ:  # a "line" longer than any MLflow writes: not a metric file
            log.warning("%s: no line end in %d bytes; it is not read again", path, MAX_LINE_READ)
            state.broken = True
        state.offset += used
        return points_of(rows, state.steps)
