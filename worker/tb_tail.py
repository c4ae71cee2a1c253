"""Scalars from every TensorBoard event file a job writes, wherever it writes them.

Lightning's TensorBoardLogger, the Hugging Face Trainer's ``report_to="tensorboard"``, Accelerate's
``log_with="tensorboard"`` and a plain ``SummaryWriter`` all write ``events.out.tfevents.*`` files
somewhere under the working directory. Each file is read incrementally with tensorboard's own loader
(it keeps its place and leaves a half-written record for the next read); what one ``read`` returns is
held until ``ack`` (the rows committed), so a database blip re-offers the same points instead of losing them.
torchyard's own ``artifacts/tensorboard`` is skipped: it mirrors the SDK's metrics, which arrive through events.jsonl.
So are event files the job was uploaded with and never changed (an old local run's): they are not this job's metrics.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.code_bundles.files import CODE_DIR_NAME
from jobs.reads.workdir_files import WORKDIR_NAME, Uploaded, read_manifest

log = logging.getLogger(__name__)

EVENT_FILE_MARK = "tfevents"
# Never walked: the SDK's own mirror, logs, environments and caches a job may keep in its tree.
SKIP_DIRS = frozenset({"logs", ".git", ".venv", "venv", "site-packages", "__pycache__", "node_modules", ".cache"})
OWN_MIRROR = Path("artifacts") / "tensorboard"
# Not the job's output: the SDK's own mirror, and the unpacked upload (read-only to the job).
SKIP_PATHS = frozenset({OWN_MIRROR, Path(CODE_DIR_NAME)})
MAX_FILES = 256  # event files followed per job; a job writing more gets the first ones found
MAX_WALK = 20_000  # directory entries looked at per scan
RESCAN_S = 2.0  # how often the tree is walked for new files; known files are read every tick
MAX_NAME = 128  # the metrics table's name column
MAX_STEP = 2**31 - 1


@dataclass(frozen=True)
class Point:
    name: str
    step: int
    value: float
    time: float


def find_event_files(root: Path, limit: int = MAX_FILES) -> list[Path]:
    """Event files under ``root``, breadth-first in name order, without following links."""
    found: list[Path] = []
    seen = 0
    pending = [root]
    while pending and len(found) < limit and seen < MAX_WALK:
        here = pending.pop(0)
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    rel = Path(entry.path).relative_to(root)
                    if entry.name not in SKIP_DIRS and rel not in SKIP_PATHS:
                        pending.append(Path(entry.path))
                elif EVENT_FILE_MARK in entry.name and entry.is_file(follow_symlinks=False):
                    found.append(Path(entry.path))
            except OSError:
                continue
            if len(found) >= limit:
                break
    return found


def scalars(event: Any, plugins: dict[str, str]) -> list[Point]:
    """The scalar values of one event (after tensorboard's compat migration: simple_value becomes a tensor).
    ``plugins`` remembers each tag's plugin: TF2 writers put the metadata on a tag's first value only."""
    if not event.HasField("summary"):
        return []
    from tensorboard.util import tensor_util  # numpy and protobuf, only once a file is read

    points = []
    step = int(event.step)
    for value in event.summary.value:
        plugin = value.metadata.plugin_data.plugin_name
        if plugin:
            plugins[value.tag] = plugin
        if plugins.get(value.tag) != "scalars" or not value.HasField("tensor"):
            continue
        try:
            array = tensor_util.make_ndarray(value.tensor)
            number = float(array.item())
        except (ValueError, TypeError):
            continue
        if 0 <= step <= MAX_STEP and 0 < len(value.tag) <= MAX_NAME:
            points.append(Point(value.tag, step, number, float(event.wall_time)))
    return points


class _File:
    def __init__(self, path: Path):
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        self.loader = EventFileLoader(str(path))
        self.plugins: dict[str, str] = {}


class TensorBoardTail:
    """Follows the event files under ``root``; ``read`` returns new points, ``ack`` confirms they are stored."""

    def __init__(self, root: Path, rescan_s: float = RESCAN_S):
        self.root = root
        self.rescan_s = rescan_s
        self.files: dict[Path, _File] = {}
        self.pending: list[Point] = []
        self._next_scan = 0.0
        self.available = True
        self.unreadable: str | None = None  # what the job's status says when event files exist but cannot be read
        self._uploaded: Uploaded = {}

    def _uploaded_unchanged(self, path: Path) -> bool:
        """An event file the job was uploaded with, as it was: an old run's metrics, not this job's."""
        try:
            relative = path.relative_to(self.root / WORKDIR_NAME).as_posix()
            st = os.lstat(path)
        except (ValueError, OSError):
            return False
        if not self._uploaded:
            self._uploaded = read_manifest(self.root)  # written once, before the ranks start
        return self._uploaded.get(relative) == (st.st_size, st.st_mtime_ns)

    def _scan(self) -> None:
        for path in find_event_files(self.root):
            if path in self.files or len(self.files) >= MAX_FILES or self._uploaded_unchanged(path):
                continue
            try:
                self.files[path] = _File(path)
            except ImportError as exc:
                log.warning("tensorboard is not importable in the worker (%s); event files are not read", exc)
                self.available = False
                self.unreadable = (f"warning: the job wrote TensorBoard event files ({path.relative_to(self.root)}) but this "
                                   f"worker cannot read them ({exc}), so their scalars are not in its metrics; the worker's "
                                   "environment needs tensorboard (`pip install -e .` installs it)")
                return
            except Exception as exc:  # noqa: BLE001 - an unreadable file is skipped, the job goes on
                log.warning("cannot open event file %s: %s", path, exc)

    def read(self, force_scan: bool = False) -> list[Point]:
        """Points written since the last acknowledged read (the unacknowledged ones again first)."""
        if not self.available or not self.root.is_dir():
            return list(self.pending)
        now = time.monotonic()
        if force_scan or now >= self._next_scan:
            self._scan()
            self._next_scan = now + self.rescan_s
        for path, state in self.files.items():
            try:
                for event in state.loader.Load():
                    self.pending.extend(scalars(event, state.plugins))
            except Exception as exc:  # noqa: BLE001 - a corrupt record ends that file's reading, not the job
                log.warning("event file %s: %s", path, exc)
        return list(self.pending)

    def ack(self, count: int) -> None:
        """The first ``count`` points of the last read are stored."""
        del self.pending[:count]
