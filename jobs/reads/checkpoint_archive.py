"""A directory checkpoint (a Hugging Face ``checkpoint-N/``, an Accelerate ``save_state`` directory) served
as one uncompressed tar stream: ``GET /v1/jobs/{id}/checkpoints/{step}/archive``.

The tree is listed without following symlinks, and each regular file is opened with ``artifacts.open_under``
(``O_NOFOLLOW`` at every component) and sized from its descriptor, so nothing outside the run directory
is served and a file that grows while it is read is cut at the size its header announced."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from sqlmodel import Session

from jobs.reads import artifacts
from jobs.reads.artifacts import FileUnavailable
from jobs.reads.job_lookup import checkpoints, get_job
from jobs.settings import Settings
from jobs.store.models import Checkpoint

MAX_FILES = 10_000
_BLOCK = 512


def checkpoint_tree(session: Session, settings: Settings, owner: str, job_id: str, step: int) -> tuple[Checkpoint, list[str]]:
    """The checkpoint at ``step`` and its regular files (relative to the run directory); FileUnavailable if none."""
    get_job(session, owner, job_id)
    saved = [c for c in checkpoints(session, job_id) if c.step == step]
    if not saved:
        raise FileUnavailable(f"job {job_id} has no checkpoint at step {step}")
    ckpt = saved[-1]
    local = artifacts.safe_path(settings, job_id, ckpt.path)
    if local is None or local.is_symlink() or not local.is_dir():
        raise FileUnavailable(f"job {job_id}: the checkpoint of step {step} is not a directory here"
                              + ("; download its file from /weights" if local is not None and local.is_file() else ""))
    root = artifacts.job_dir(settings, job_id)
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(local, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if stat.S_ISREG(path.lstat().st_mode):
                files.append(str(path.relative_to(root)))
            if len(files) > MAX_FILES:
                raise FileUnavailable(f"job {job_id}: the checkpoint of step {step} has more than {MAX_FILES} files")
    return ckpt, files


def tar_stream(settings: Settings, job_id: str, checkpoint_path: str, files: list[str]) -> Iterator[bytes]:
    """The files as a tar archive, named under the checkpoint directory's own name."""
    base = Path(checkpoint_path).parent
    for relative in files:
        try:
            f = artifacts.open_file(settings, job_id, relative)
        except FileNotFoundError:
            continue  # deleted or swapped for a link since it was listed
        with f:
            size = os.fstat(f.fileno()).st_size
            info = tarfile.TarInfo(str(Path(relative).relative_to(base)))
            info.size, info.mode, info.mtime = size, 0o644, int(os.fstat(f.fileno()).st_mtime)
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            left = size
            while left > 0:
                chunk = f.read(min(left, 1 << 20)) or b"\0" * min(left, 1 << 20)  # a shrunken file is padded
                left -= len(chunk)
                yield chunk
            if size % _BLOCK:
                yield b"\0" * (_BLOCK - size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)
