"""Metrics a script prints, read from rank 0's lines of the merged log with the spec's ``metrics.from_output``
templates (jobspec/output_metrics.py), whose OutputReader gives a match without ``{step}`` its step.

Every attempt's ``logs/attempt-<k>/ranks.log`` is followed, oldest attempt first, as the other tails read every file
again from its start on a new attempt: a resumed attempt prints its steps after the ones it resumed from, so what it
prints at a step replaces what a killed attempt printed there, and points stored already with the same value are
left alone (jobs/store/ingest_found.py). Only complete lines count; a line longer than the ranks write in one piece
is matched on its first MAX_LINE_CHARS characters.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from jobspec.output_metrics import MAX_LINE_CHARS, OutputReader, Template
from jobspec.rank_logs import MERGED_LOG, merged_line_prefix
from worker.run_files import MAX_READ, FileTail, Listing, Point, open_in

log = logging.getLogger(__name__)

RANK_ZERO = merged_line_prefix(0)
MAX_PARTIAL = 64 << 10  # an unfinished line kept this long is matched as it stands
_ATTEMPT = re.compile(r"^attempt-(\d{1,9})$")


@dataclass
class _Log:
    handle: BinaryIO
    partial: bytes = b""


class OutputMetricsTail(FileTail[_Log]):
    """Follows the merged logs of the job's attempts under ``root`` and matches rank 0's lines with ``templates``."""

    def __init__(self, root: Path, templates: Sequence[Template], rescan_s: float):
        super().__init__(root, rescan_s)
        # The step printed last carries across the attempts' logs, read oldest first, so a new reader (the next
        # attempt's, a restarted worker's) gives the same lines the same steps.
        self.reader = OutputReader(templates)

    def matches(self, name: str) -> bool:
        return name == MERGED_LOG

    def candidates(self, listing: Listing) -> list[Path]:
        # Under logs/, which the shared walk skips (the SDK's and torchrun's own files are there).
        attempts = []
        try:
            with os.scandir(self.root / "logs") as entries:
                for entry in entries:
                    m = _ATTEMPT.match(entry.name)
                    if m is not None and entry.is_dir(follow_symlinks=False):
                        attempts.append((int(m.group(1)), Path(entry.path) / MERGED_LOG))
        except OSError:
            return []
        return [path for _, path in sorted(attempts) if path.is_file() and not path.is_symlink()]

    def open(self, path: Path) -> _Log:
        return _Log(open_in(self.root, path))

    def new_points(self, path: Path, state: _Log) -> list[Point]:
        try:
            data = state.partial + state.handle.read(MAX_READ)
        except OSError as exc:
            log.warning("%s: %s", path, exc)
            return []
        lines = data.split(b"\n")
        state.partial = lines.pop()
        if len(state.partial) > MAX_PARTIAL:
            lines.append(state.partial)
            state.partial = b""
        now = time.time()
        points: list[Point] = []
        for line in lines:
            if line.startswith(RANK_ZERO):
                text = line[len(RANK_ZERO):len(RANK_ZERO) + MAX_LINE_CHARS].decode("utf-8", "replace")
                points.extend(Point(name, step, value, now) for name, step, value in self.reader.points(text))
        return points
