"""Files of a run directory served by the API: rank logs, checkpoint sizes, weights files.

Every path is resolved (symlinks included) and must stay under the job's run directory inside
``TORCHYARD_RUNS_DIR``: an event or a symlink that points elsewhere serves nothing.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from jobs.settings import Settings
from trainer.spec import resolve_under

log = logging.getLogger(__name__)

LAUNCHER_LOG = "launcher.log"
_RESTART = re.compile(r"attempt_(\d+)$")
_CHUNK = 64 * 1024


def job_dir(settings: Settings, job_id: str) -> Path:
    """The job's run directory as this process sees the runs volume."""
    return settings.runs_dir.resolve() / job_id


def safe_path(settings: Settings, job_id: str, relative: str) -> Path | None:
    """``relative`` under the job's run directory, or None when it would leave it."""
    root = job_dir(settings, job_id)
    target = resolve_under(root, relative)
    if target is None or target == root:
        log.warning("job %s: refusing path %r outside its run directory", job_id, relative, extra={"job_id": job_id})
        return None
    return target


def log_file(settings: Settings, job_id: str, attempt: int, rank: int | None, stream: str = "stderr") -> Path | None:
    """The launcher log (rank None) or a rank's stdout/stderr of the newest torchrun restart; None when absent.

    torchrun ``--log-dir D --redirects=3`` writes ``D/<run id>/attempt_<restart>/<rank>/{stdout,stderr}.log``."""
    base = f"logs/attempt-{attempt}"
    if rank is None:
        path = safe_path(settings, job_id, f"{base}/{LAUNCHER_LOG}")
        return path if path is not None and path.is_file() else None
    attempt_dir = safe_path(settings, job_id, base)
    if attempt_dir is None or not attempt_dir.is_dir():
        return None
    candidates = []
    for path in attempt_dir.glob(f"*/attempt_*/{rank}/{stream}.log"):
        restart = _RESTART.match(path.parent.parent.name)
        if restart and path.is_file():
            # One torchrun run-id directory per launch (normally one per attempt): the newest launch,
            # then its highest restart.
            candidates.append((path.parent.parent.parent.stat().st_mtime, int(restart.group(1)), path))
    if not candidates:
        return None
    path = max(candidates, key=lambda c: (c[0], c[1]))[2]
    # Resolved again: a rank directory that is a symlink out of the run directory serves nothing.
    return safe_path(settings, job_id, f"{base}/{path.relative_to(attempt_dir)}")


def tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of the file start (reads backwards, never the whole file)."""
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        pos, newlines = end, 0
        # A trailing newline ends the last line; it does not start another one.
        if end:
            f.seek(end - 1)
            if f.read(1) == b"\n":
                newlines = -1
        while pos > 0:
            step = min(_CHUNK, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 0x0A:
                    newlines += 1
                    if newlines == lines:
                        return pos + i + 1
        return 0


def read_range(path: Path, start: int, end: int | None = None) -> bytes:
    with path.open("rb") as f:
        f.seek(start)
        return f.read(-1 if end is None else max(0, end - start))


def iter_range(path: Path, start: int, end: int) -> Iterator[bytes]:
    """The bytes [start, end) in chunks; ``end`` is fixed up front so a growing file still sends what was promised."""
    with path.open("rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            block = f.read(min(_CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block


def tree_size(path: Path) -> int | None:
    """Bytes of all regular files under ``path`` (symlinks not followed); None when it is gone."""
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return None
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                try:
                    total += os.stat(full).st_size
                except FileNotFoundError:  # deleted (keep_last) while we walked
                    continue
    return total
