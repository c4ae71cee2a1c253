"""A cgroup v2 per attempt, where this worker may write one: ``<mount>/torchyard/<worker>/<job>-a<attempt>``.

Its ranks join it in their preexec (worker/sandbox/job_users.py); ending the attempt writes ``1`` to its
``cgroup.kill`` (every process in it, however it detached itself) and removes it. Killing by uid runs
as well, always: this is the faster, engine-side half where the host allows it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@lru_cache(maxsize=1)
def mount_point() -> Path | None:
    """Where the cgroup2 hierarchy is mounted (/proc/self/mountinfo), or None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if sep and right.split()[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def worker_root(worker_id: str) -> Path | None:
    """This worker's cgroup parent, created if it may be; None where cgroup v2 cannot be written here."""
    mount = mount_point()
    if mount is None:
        return None
    root = mount / "torchyard" / _SAFE.sub("_", worker_id)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(root, os.W_OK) or not (mount / "torchyard").exists():
        return None
    return root


def create(worker_id: str, job_id: str, attempt: int) -> Path | None:
    """The attempt's own cgroup (empty), or None where there can be none; then killing by uid alone ends it."""
    root = worker_root(worker_id)
    if root is None:
        return None
    path = root / f"{_SAFE.sub('_', job_id)}-a{attempt}"
    if path.exists():
        destroy(path)  # left by a worker that died: whatever is in it belongs to no live attempt
    try:
        path.mkdir()
    except OSError as exc:
        log.warning("cannot create cgroup %s (%s); ending attempts by uid only", path, exc)
        return None
    if not (path / "cgroup.kill").exists():  # kernels before 5.14
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def members(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def destroy(path: Path, timeout_s: float = 5.0) -> None:
    """Kill everything in the cgroup and remove it (it can be removed once empty)."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                log.error("cgroup %s still busy after %.0fs (%s): %s", path, timeout_s, exc, members(path))
                return
            time.sleep(0.02)
