"""The files a job wrote by itself in its run directory, followed by the metric tails (worker/tb_tail.py,
worker/wandb_tail.py): one walk, the same directories skipped, the files it was uploaded with set apart, and
what one read found held until it is stored."""

from __future__ import annotations

import itertools
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Generic, TypeVar

from jobs.code_bundles.files import CODE_DIR_NAME
from jobs.reads.artifacts import open_under
from jobs.reads.workdir_files import WORKDIR_NAME, Uploaded, read_manifest

log = logging.getLogger(__name__)

S = TypeVar("S")

# Never walked: the SDK's own mirror, logs, environments and caches a job may keep in its tree.
SKIP_DIRS = frozenset({"logs", ".git", ".venv", "venv", "site-packages", "__pycache__", "node_modules", ".cache"})
OWN_MIRROR = Path("artifacts") / "tensorboard"
# Not the job's output: the SDK's own mirror, and the unpacked upload (read-only to the job).
SKIP_PATHS = frozenset({OWN_MIRROR, Path(CODE_DIR_NAME)})
MAX_FILES = 256  # files followed per job and kind; a job writing more gets the first ones found
MAX_WALK = 20_000  # directory entries looked at per scan
MAX_READ = 4 << 20  # bytes a tail reads from one growing file per tick; the rest waits for the next
RESCAN_S = 2.0  # how often the tree is walked for new files; known files are read every tick


@dataclass(frozen=True)
class Point:
    name: str
    step: int
    value: float
    time: float


def open_in(root: Path, path: Path) -> BinaryIO:
    """``path``, a file the job wrote under ``root``, opened for reading without following a link anywhere below
    ``root`` and only when it is a regular file: a link the job swaps in after the worker found the file would
    have it read another job's file as this one's, and a FIFO would block a plain open forever.
    FileNotFoundError for anything refused."""
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError as exc:
        raise FileNotFoundError(path) from exc
    return open_under(root, relative)


def _regular_files(root: Path) -> Iterator[os.DirEntry[str]]:
    """The regular files under ``root``, breadth-first in name order, without following links, until MAX_WALK
    directory entries were looked at."""
    seen = 0
    pending = [root]
    while pending and seen < MAX_WALK:
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
                elif entry.is_file(follow_symlinks=False):
                    yield entry
            except OSError:
                continue


def find_files(root: Path, match: Callable[[str], bool], limit: int = MAX_FILES) -> list[Path]:
    """Files under ``root`` whose name ``match``es, breadth-first in name order, without following links."""
    return [Path(e.path) for e in itertools.islice((e for e in _regular_files(root) if match(e.name)), limit)]


class Listing:
    """The regular files under ``root`` as ``find_files`` walks it, walked once when first asked: the tails of one
    tick share one walk of the run directory (each walk of a 20,000-file tree took 15-16 ms: docs/BENCHMARKS.md)."""

    def __init__(self, root: Path):
        self.root = root
        self._files: list[tuple[str, str]] | None = None  # name, path

    def _walked(self) -> list[tuple[str, str]]:
        if self._files is None:
            self._files = [(e.name, e.path) for e in _regular_files(self.root)]
        return self._files

    def matching(self, match: Callable[[str], bool], limit: int = MAX_FILES) -> list[Path]:
        """What ``find_files(root, match, limit)`` finds."""
        return [Path(path) for name, path in self._walked() if match(name)][:limit]

    def under(self, folder: Path, limit: int = MAX_FILES) -> list[Path]:
        """The files of the walk inside ``folder``."""
        prefix = os.path.join(folder, "")
        return [Path(path) for _, path in self._walked() if path.startswith(prefix)][:limit]


class LastOffered:
    """The value a tail offered last at each metric name and step: a file read again from its start (a CSV written
    again, a newer checkpoint's whole history) offers only the points that are new or changed."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, int], float] = {}

    def changed(self, points: Iterable[Point]) -> list[Point]:
        fresh = [p for p in points if self._values.get((p.name, p.step)) != p.value]
        self._values.update({(p.name, p.step): p.value for p in fresh})
        return fresh


class UploadedFiles:
    """The files of the job's upload, as uploaded: an old local run's event or run files there are not this job's."""

    def __init__(self, root: Path):
        self.root = root
        self._uploaded: Uploaded = {}

    def unchanged(self, path: Path) -> bool:
        try:
            relative = path.relative_to(self.root / WORKDIR_NAME).as_posix()
            st = os.lstat(path)
        except (ValueError, OSError):
            return False
        if not self._uploaded:
            self._uploaded = read_manifest(self.root)  # written once, before the ranks start
        return self._uploaded.get(relative) == (st.st_size, st.st_mtime_ns)


class FileTail(ABC, Generic[S]):
    """Follows the files of one kind under ``root`` (what ``matches`` names, each opened once into a state ``S``);
    ``read`` returns the points written since the last acknowledged read, ``ack`` confirms they are stored, so a
    database blip re-offers the same points instead of losing them."""

    def __init__(self, root: Path, rescan_s: float = RESCAN_S):
        self.root = root
        self.rescan_s = rescan_s
        self.files: dict[Path, S] = {}
        self.pending: list[Point] = []
        self.available = True
        self.unreadable: str | None = None  # what the job's status says when such files exist but cannot be read
        self._next_scan = 0.0
        self._uploaded = UploadedFiles(root)

    @abstractmethod
    def matches(self, name: str) -> bool:
        """Whether a file of this name is of this kind (or, for ``candidates`` of its own, tells where they are)."""

    @abstractmethod
    def open(self, path: Path) -> S:
        """The reading state of a new file; ImportError when this worker lacks what reads it."""

    @abstractmethod
    def new_points(self, path: Path, state: S) -> list[Point]:
        """What ``path`` holds since the last call; a damaged file logs and returns what it could read."""

    def missing(self, path: Path, exc: ImportError) -> str:
        """The warning a job's status carries when the worker cannot read its files."""
        return f"warning: this worker cannot read {path.relative_to(self.root)} ({exc})"

    def candidates(self, listing: Listing) -> list[Path]:
        """The files of this kind under ``root`` now; a kind its names alone do not tell says more."""
        return listing.matching(self.matches)

    def _scan(self, listing: Listing) -> None:
        for path in self.candidates(listing):
            if path in self.files or len(self.files) >= MAX_FILES or self._uploaded.unchanged(path):
                continue
            try:
                self.files[path] = self.open(path)
            except ImportError as exc:
                log.warning("cannot read %s: %s", path, exc)
                self.available, self.unreadable = False, self.missing(path, exc)
                return
            except Exception as exc:  # noqa: BLE001 - an unreadable file is skipped, the job goes on
                log.warning("cannot open %s: %s", path, exc)

    def read(self, force_scan: bool = False, listing: Listing | None = None) -> list[Point]:
        """Points written since the last acknowledged read (the unacknowledged ones again first); ``listing``: the
        run directory's walk of this tick, when other tails share it."""
        if not self.available or not self.root.is_dir():
            return list(self.pending)
        now = time.monotonic()
        if force_scan or now >= self._next_scan:
            self._scan(listing or Listing(self.root))
            self._next_scan = now + self.rescan_s
        for path, state in self.files.items():
            self.pending.extend(self.new_points(path, state))
        return list(self.pending)

    def ack(self, count: int) -> None:
        """The first ``count`` points of the last read are stored."""
        del self.pending[:count]
