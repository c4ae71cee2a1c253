"""Files of a run directory served by the API: rank logs, checkpoint sizes, weights files.

What is served is opened once with ``open_under`` (no symlink followed at any component, regular
files only) and then read from that open file alone: a symlink swapped in after the open, or a
path an event names outside the run directory, serves nothing. Sizes of checkpoint trees are
measured under the job's run directory inside ``TORCHYARD_RUNS_DIR`` without following symlinks.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from jobs.settings import Settings
from jobspec.paths import resolve_under
from jobspec.rank_logs import find_rank_dir

log = logging.getLogger(__name__)

LAUNCHER_LOG = "launcher.log"
_CHUNK = 64 * 1024


class FileUnavailable(LookupError):
    """A file the API would serve does not exist here, or lies outside the runs directory."""


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


def plain_parts(relative: str) -> tuple[str, ...]:
    """The components of a relative path that names a file below its root; FileNotFoundError for an absolute path, a
    NUL, an empty, ``.`` or ``..`` component."""
    parts = PurePosixPath(relative).parts
    if not parts or "\x00" in relative or os.path.isabs(relative) or any(p in ("", ".", "..") for p in parts):
        raise FileNotFoundError(relative)
    return parts


def open_under(root: Path, relative: str, *, single_link: bool = False) -> BinaryIO:
    """Open the regular file ``root/relative`` for reading without following a symlink anywhere on the way.

    Each directory is opened relative to its parent's descriptor with ``O_NOFOLLOW``, then the file
    itself, so a symlink swapped in after a check cannot redirect the read: the caller serves from the
    returned file, never from the path again. FIFOs, devices and directories are refused too (opened
    non-blocking, so a FIFO cannot hang the caller). With ``single_link`` a file with more than one hard link is
    refused as a symlink is: a job can link, into its own directory, a file it can read that is not its to serve.
    Raises FileNotFoundError for anything refused."""
    parts = plain_parts(relative)
    no_follow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, no_follow | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            child = os.open(part, no_follow | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        file_fd = os.open(parts[-1], no_follow | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:  # ELOOP (a symlink), ENOTDIR, ENOENT ...: all mean "not served"
        raise FileNotFoundError(relative) from exc
    finally:
        os.close(fd)
    st = os.fstat(file_fd)
    if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink > 1):
        os.close(file_fd)
        raise FileNotFoundError(relative)
    os.set_blocking(file_fd, True)
    return os.fdopen(file_fd, "rb")


def open_file(settings: Settings, job_id: str, relative: str, *, single_link: bool = False) -> BinaryIO:
    """A file of the job's run directory, opened by ``open_under``; FileNotFoundError when it is missing or refused."""
    return open_under(job_dir(settings, job_id), relative, single_link=single_link)


def open_kept(settings: Settings, job_id: str, relative: str, *, single_link: bool = False) -> BinaryIO:
    """A file of the job's run directory the API serves (weights, artifacts, logs, checkpoint files): with an object
    store (TORCHYARD_STORAGE_URL) read from the store only, never from a worker's path (as it is now: open it again to
    see what a later upload added; StoreError when the store does not answer); else ``open_file``.
    FileNotFoundError when it is not there."""
    if settings.storage_url is None:
        return open_file(settings, job_id, relative, single_link=single_link)
    # Imported here: jobs.storage uses this module's open_under for what it uploads.
    from jobs.storage.checkpoints import job_key
    from jobs.storage.store import store_for
    from jobs.storage.stored_file import open_stored

    store = store_for(settings)
    assert store is not None
    return open_stored(store, job_key(job_id, "/".join(plain_parts(relative))))


def log_file(settings: Settings, job_id: str, attempt: int, rank: int | None, stream: str = "stderr") -> str | None:
    """Where the launcher log (rank None) or a rank's stdout/stderr of the newest torchrun restart is, relative to
    the run directory; None when absent. Only names are looked at here: open the result with ``open_file``, which
    refuses a symlink anywhere on the way.

    torchrun ``--log-dir D --redirects=3`` writes ``D/<run id>/attempt_<restart>/<local rank>/{stdout,stderr}.log``;
    ``rank`` is the global rank (jobspec.rank_logs.find_rank_dir maps it)."""
    base = f"logs/attempt-{attempt}"
    if rank is None:
        return f"{base}/{LAUNCHER_LOG}"
    rank_dir = find_rank_dir(job_dir(settings, job_id) / base, rank)
    if rank_dir is None or not (rank_dir / f"{stream}.log").is_file():
        return None
    return f"{base}/{rank_dir.relative_to(job_dir(settings, job_id) / base).as_posix()}/{stream}.log"


def tail_offset(f: BinaryIO, lines: int, end: int) -> int:
    """Byte offset where the last ``lines`` lines of the open file's first ``end`` bytes start.

    Reads backwards in blocks and counts newlines with ``bytes.count``/``rfind``, never the whole file
    and never byte by byte in Python."""
    if end <= 0:
        return 0
    f.seek(end - 1)
    # A trailing newline ends the last line; it does not start another one.
    wanted = lines + 1 if f.read(1) == b"\n" else lines
    pos = end
    while pos > 0:
        step = min(_CHUNK, pos)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        found = block.count(b"\n")
        if found < wanted:
            wanted -= found
            continue
        cut = len(block)
        for _ in range(wanted):
            cut = block.rfind(b"\n", 0, cut)
        return pos + cut + 1
    return 0


def read_at(f: BinaryIO, start: int, size: int) -> bytes:
    """Up to ``size`` bytes of the open file from ``start``."""
    f.seek(start)
    return f.read(size)


def iter_file(f: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """The bytes [start, end) of the open file in chunks, then closes it. ``end`` is fixed up front, so a
    growing file still sends exactly what was promised."""
    try:
        f.seek(start)
        left = end - start
        while left > 0:
            block = f.read(min(_CHUNK, left))
            if not block:
                return
            left -= len(block)
            yield block
    finally:
        f.close()


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


ARTIFACTS_DIR = "artifacts"
MAX_LISTED = 10_000


def single_files(root: Path, skip_dirs: frozenset[str] = frozenset()) -> Iterator[tuple[str, os.stat_result]]:
    """(path relative to ``root``, its lstat) of every regular file with one hard link below ``root``, in path order
    per directory; symlinks are neither listed nor followed, nor is a ``root`` that is one. Only what ``open_under``
    with ``single_link`` would open."""
    if root.is_symlink() or not root.is_dir():
        return
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        for name in sorted(files):
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except FileNotFoundError:  # deleted while we walked
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                yield Path(full).relative_to(root).as_posix(), st


def list_artifacts(run_dir: Path, limit: int = MAX_LISTED) -> list[tuple[str, int, float]]:
    """(path relative to ``artifacts/``, size, modified) of every regular file under the run's ``artifacts/``,
    sorted by path, at most ``limit``. Symlinks (to files or directories) are neither listed nor followed, and files
    with more than one hard link are not listed, so the listing never names anything ``open_artifact`` refuses."""
    found = list(itertools.islice(((rel, st.st_size, st.st_mtime) for rel, st in single_files(run_dir / ARTIFACTS_DIR)), limit))
    return sorted(found)


def open_artifact(run_dir: Path, relative: str) -> BinaryIO:
    """The artifact ``relative`` (to ``artifacts/``), opened by ``open_under``: FileNotFoundError when it is missing,
    not a regular file, has more than one hard link, or is reached through a symlink, ``..`` or an absolute path."""
    if not relative or relative.startswith("/") or "\\" in relative:
        raise FileNotFoundError(relative)
    return open_under(run_dir, f"{ARTIFACTS_DIR}/{relative}", single_link=True)
