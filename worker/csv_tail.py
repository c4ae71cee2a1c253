"""Metrics the CSV files of Lightning's ``CSVLogger`` and timm's ``train.py`` hold.

- Lightning: ``metrics.csv``, a header of every key logged so far (``step`` among them) and a row a ``log_metrics``
  call, the cells of keys not logged in that call empty. Lightning appends rows as it flushes (every
  ``flush_logs_every_n_steps``, and at the end), and when a key appears that the header lacks (``val_loss`` at the
  first validation) it writes the whole file again under the wider header.
- timm: ``summary.csv``, a row an epoch (``epoch,train_loss,eval_loss,eval_top1,eval_top5,lr``) at the epoch; a
  resumed run first drops the rows from its starting epoch on, writing the file again shorter.

A row's step is its ``step`` column, else its ``epoch`` column (that column is then no metric). The tail reads the
rows appended since its last read; a file that shrank or whose header changed is read again from its start, and a
value read already at a name and step is not offered twice. Only whole lines are read.
"""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from jobs.store.ingest_found import MAX_STEP
from worker.run_files import MAX_READ, FileTail, LastOffered, Point, open_in

log = logging.getLogger(__name__)

CSV_FILES = frozenset({"metrics.csv", "summary.csv"})  # Lightning's CSVLogger, timm's train.py
STEP_COLUMNS = ("step", "epoch")  # the first a header has is the rows' step
MAX_HEADER = 64 << 10


def row_points(header: list[str], row: list[str], when: float) -> list[Point]:
    """The numbers of one row at its step (``step``, else ``epoch``; pure); a row without a whole step, and cells
    that are no number, give nothing. A diverged value (``nan``) is a point: it is a gap once stored (jobs/store/ingest_found.py)."""
    column = next((c for c in STEP_COLUMNS if c in header), None)
    if len(row) != len(header) or column is None:
        return []
    cells = dict(zip(header, row, strict=True))
    try:
        step = int(cells.pop(column))
    except ValueError:
        return []
    if not 0 <= step <= MAX_STEP:
        return []
    points = []
    for name, cell in cells.items():
        try:
            value = float(cell)
        except ValueError:
            continue  # empty: not logged in this call
        if name:
            points.append(Point(name, step, value, when))
    return points


@dataclass
class _Csv:
    handle: BinaryIO
    header: bytes = b""
    offset: int = 0  # of the first byte not yet read as a whole line
    last_line: bytes = b""  # the last whole line read, which ends at offset while the file is only appended to
    offered: LastOffered = field(default_factory=LastOffered)
    seen: tuple[int, int] = (-1, -1)  # size and mtime when last read: a file unchanged since is not read again


class CsvLoggerTail(FileTail[_Csv]):
    """Follows the ``metrics.csv`` and ``summary.csv`` files under ``root``."""

    def matches(self, name: str) -> bool:
        return name in CSV_FILES

    def open(self, path: Path) -> _Csv:
        return _Csv(open_in(self.root, path))

    def new_points(self, path: Path, state: _Csv) -> list[Point]:
        try:
            st = os.fstat(state.handle.fileno())
            if (st.st_size, st.st_mtime_ns) == state.seen:
                return []
            start = os.pread(state.handle.fileno(), MAX_HEADER, 0)
            if b"\n" not in start:
                return []  # no whole header yet
            header = start.split(b"\n", 1)[0]
            fd, end = state.handle.fileno(), state.offset
            appended = st.st_size >= end and os.pread(fd, len(state.last_line), end - len(state.last_line)) == state.last_line
            if header != state.header or not appended:
                # Written again (a wider header, a resumed run's trimmed rows): every row again; what was offered
                # already is skipped.
                state.header, state.offset, state.last_line = header, len(header) + 1, b""
            data = os.pread(fd, MAX_READ, state.offset)
            if len(data) < MAX_READ:  # read to its end: nothing more until it changes
                state.seen = (st.st_size, st.st_mtime_ns)
        except OSError as exc:
            log.warning("%s: %s", path, exc)
            return []
        whole = data[:data.rfind(b"\n") + 1]
        state.offset += len(whole)
        if not whole:
            return []
        state.last_line = whole[whole.rfind(b"\n", 0, len(whole) - 1) + 1:]
        names = next(csv.reader([state.header.decode("utf-8", "replace")]), [])
        rows = csv.reader(whole.decode("utf-8", "replace").splitlines())
        return state.offered.changed(p for row in rows for p in row_points(names, row, st.st_mtime))
