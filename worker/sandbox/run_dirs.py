"""The file side of a job uid: the run directory is the job's, the rest of the service is out of its reach,
and what the job controls is opened as if an attacker had planted it.

A run directory is owned by the job uid, group the worker's gid, mode 2770: setgid, so whatever the job
creates stays in the service's group (umask 007) and the API and worker read events, logs and checkpoints
through the group, without overriding permissions. The runs root is 0711: every job reaches its own
directory, none lists the others. The bundle store is 0700 and the requirements environments 0755.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path

from jobs.settings import Settings

log = logging.getLogger(__name__)

RUN_DIR_MODE = 0o2770
RUNS_ROOT_MODE = 0o711
BUNDLES_MODE = 0o700
CODE_DIR_NAME = "code"  # the unpacked bundle (jobs/code_bundles/files.py): read-only to the job, left as the worker made it
# Paths the worker itself writes in a run directory; a job may have replaced any of them with a link or a FIFO.
_WORKER_WRITTEN = ("spec.json", ".spec.json.tmp", "error.json", "events.jsonl", "checkpoints", "checkpoints/latest",
                   "checkpoints/.latest.tmp", "logs")


def secure_service_dirs(settings: Settings) -> None:
    """At worker start: the runs root traversable only, the bundle store private, the environments read-only."""
    for path, mode in ((settings.runs_dir, RUNS_ROOT_MODE), (settings.bundles_root, BUNDLES_MODE)):
        _ensure_mode(path, mode)
    venvs = settings.venvs_root
    if venvs.is_dir():
        for root, dirs, files in os.walk(venvs):
            for name in [".", *dirs, *files]:
                path = os.path.join(root, name)
                with contextlib.suppress(OSError):
                    st = os.lstat(path)
                    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)


def _ensure_mode(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    current = stat.S_IMODE(path.stat().st_mode)
    if current != mode:
        try:
            os.chmod(path, mode)
            log.info("%s was mode %o; now %o", path, current, mode)
        except OSError as exc:
            log.error("%s is mode %o and cannot be made %o (%s): jobs may reach it", path, current, mode, exc)


def scrub(run_dir: Path, attempt: int) -> None:
    """Remove links and special files a job left where the worker writes (spec.json, logs/attempt-N, ...),
    so the worker's writes stay inside the run directory. Nothing of the job runs while this is called."""
    for rel in (*_WORKER_WRITTEN, f"logs/attempt-{attempt}"):
        path = run_dir / rel
        try:
            st = os.lstat(path)
        except OSError:
            continue
        expect_dir = rel in ("checkpoints", "logs") or rel.startswith("logs/")
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISDIR(st.st_mode) != expect_dir) or not (
                stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            log.warning("removing %s from %s: a job made it something the worker does not write", rel, run_dir)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def hand_over(run_dir: Path, uid: int, job_uids: tuple[int, int]) -> None:
    """Make the run directory the job uid's: every directory and file the worker or an earlier attempt (perhaps
    under another uid) made, except the read-only code. Every entry is pinned by an ``O_PATH`` descriptor opened
    without following links, and changed through it: a link swapped in meanwhile is never followed. A file linked
    from elsewhere (an adopted checkpoint) keeps its owner and is made readable instead."""
    gid = os.getgid()
    low, high = job_uids

    def ours(st: os.stat_result) -> bool:
        return st.st_uid == os.getuid() or low <= st.st_uid <= high

    def visit(name: str, parent: int | None, top: bool = False) -> None:
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
            if not ours(st) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                return  # links, FIFOs, sockets, devices, other users' files: left as they are
            inode = f"/proc/self/fd/{fd}"  # the pinned inode itself, whatever the name points at now
            if stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:
                    # Shared with another run directory (hard-linked checkpoint): readable, never given away.
                    os.chmod(inode, stat.S_IMODE(st.st_mode) | 0o044)
                else:
                    os.chown(inode, uid, gid)
                    os.chmod(inode, (stat.S_IMODE(st.st_mode) | 0o660) & ~0o7007)
                return
            os.chown(inode, uid, gid)
            os.chmod(inode, RUN_DIR_MODE)  # first: a directory the job closed (0700) must be listable for the walk
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                names = os.listdir(listing)
            finally:
                os.close(listing)
            for child in names:
                if not (top and child == CODE_DIR_NAME):
                    visit(child, fd)
        finally:
            os.close(fd)

    visit(str(run_dir), None, top=True)
    code = run_dir / CODE_DIR_NAME
    if code.is_dir() and not code.is_symlink():
        _readable_by_all(code)


def _readable_by_all(code: Path) -> None:
    """The unpacked bundle: the job reads it through 'other' (it is not in the worker's group)."""
    for root, dirs, files in os.walk(code):
        for name in dirs:
            with contextlib.suppress(OSError):
                p = os.path.join(root, name)
                os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) | 0o005)
        for name in files:
            with contextlib.suppress(OSError):
                p = os.path.join(root, name)
                if not os.path.islink(p):
                    os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) | 0o004)


def open_job_file(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of a file a job controls: never through a link, never blocking on a FIFO, regular files only."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o660)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_job_bytes(path: Path, limit: int = 16 * 1024 * 1024) -> bytes:
    """Up to ``limit`` bytes of a file a job controls (see open_job_file)."""
    with os.fdopen(open_job_file(path), "rb") as f:
        return f.read(limit)
