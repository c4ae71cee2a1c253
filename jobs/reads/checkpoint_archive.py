"""A directory checkpoint (a Hugging Face ``checkpoint-N/``, an Accelerate ``save_state`` directory) served
as one uncompressed tar stream: ``GET /v1/jobs/{id}/checkpoints/{step}/archive``.

The tree is listed without following symlinks, and each regular file is opened with ``artifacts.open_under``
(``O_NOFOLLOW`` at every component) and sized from its descriptor, so nothing outside the run directory
is served and a file that grows while it is read is cut at the size its header announced.

With an object store (TORCHYARD_STORAGE_URL) the archive is read from the store only: a checkpoint of the run's
``checkpoints/`` once it is there complete (its manifest and every file it names at its size, worker/uploads.py),
its files as the manifest lists them; a script's own directory checkpoint once its found manifest is there complete
(jobs/storage/found_checkpoints.py)."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from sqlmodel import Session

from jobs.reads import artifacts
from jobs.reads.artifacts import FileUnavailable
from jobs.reads.job_lookup import checkpoints, get_job
from jobs.settings import Settings
from jobs.storage import found_checkpoints
from jobs.storage.checkpoints import CHECKPOINTS, complete_stored
from jobs.storage.manifest import ManifestError
from jobs.storage.store import NotInStore, ObjectStore, store_for
from jobs.storage.stored_file import size_of
from jobs.store.models import Checkpoint

MAX_FILES = 10_000
_BLOCK = 512


def checkpoint_tree(session: Session, settings: Settings, owner: str | None, job_id: str, step: int) -> tuple[Checkpoint, list[str]]:
    """The checkpoint at ``step`` and its regular files (relative to the run directory); FileUnavailable if none."""
    get_job(session, owner, job_id)
    saved = [c for c in checkpoints(session, job_id) if c.step == step]
    if not saved:
        raise FileUnavailable(f"job {job_id} has no checkpoint at step {step}")
    ckpt = saved[-1]
    store = store_for(settings)
    if store is not None:
        return ckpt, _stored_tree(store, job_id, ckpt)
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


def _stored_tree(store: ObjectStore, job_id: str, ckpt: Checkpoint) -> list[str]:
    """The files of the checkpoint's complete copy in the store, as its manifest lists them (relative to the run
    directory); FileUnavailable when the store holds no complete copy."""
    parts = PurePosixPath(ckpt.path).parts
    if ckpt.details.get("found"):  # a script's own directory checkpoint (a Trainer's checkpoint-N/)
        found = found_checkpoints.stored_tree(store, job_id, ckpt.path)
        if found is None:
            raise FileUnavailable(f"job {job_id}: the checkpoint of step {ckpt.step} is not complete in the object store (yet)")
        return found
    if len(parts) != 2 or parts[0] != CHECKPOINTS or parts[1] in (".", ".."):
        raise FileUnavailable(f"job {job_id}: the checkpoint of step {ckpt.step} ({ckpt.path}) is not in the object store; "
                              f"only the run's {CHECKPOINTS}/ directories are uploaded")
    name = parts[1]
    try:
        manifest = complete_stored(store, job_id, name)
        files = [f"{CHECKPOINTS}/{name}/{'/'.join(artifacts.plain_parts(relative))}" for relative in sorted(manifest.files)]
    except (NotInStore, ManifestError, FileNotFoundError):  # FileNotFoundError: the manifest names a path outside it
        raise FileUnavailable(f"job {job_id}: the checkpoint of step {ckpt.step} is not complete in the object store (yet)"
                              "; a file checkpoint downloads from /weights") from None
    if len(files) > MAX_FILES:
        raise FileUnavailable(f"job {job_id}: the checkpoint of step {ckpt.step} has more than {MAX_FILES} files")
    return files


def _open(settings: Settings, job_id: str, relative: str, ckpt: Checkpoint) -> tuple[BinaryIO, int, int]:
    """The file opened, its size and its time: a local file's from its descriptor, a stored one's as listed, with the
    checkpoint's time. FileNotFoundError when it is gone."""
    f = artifacts.open_kept(settings, job_id, relative)
    if settings.storage_url is not None:
        return f, size_of(f), int(ckpt.created_at.timestamp())
    st = os.fstat(f.fileno())
    return f, st.st_size, int(st.st_mtime)


def tar_stream(settings: Settings, job_id: str, ckpt: Checkpoint, files: list[str]) -> Iterator[bytes]:
    """The files as a tar archive, named under the checkpoint directory's own name."""
    base = Path(ckpt.path).parent
    for relative in files:
        try:
            f, size, mtime = _open(settings, job_id, relative, ckpt)
        except FileNotFoundError:
            continue  # deleted or swapped for a link since it was listed
        with f:
            info = tarfile.TarInfo(str(Path(relative).relative_to(base)))
            info.size, info.mode, info.mtime = size, 0o644, mtime
            yield info.tobuf(format=tarfile.PAX_FORMAT)
            left = size
            while left > 0:
                chunk = f.read(min(left, 1 << 20)) or b"\0" * min(left, 1 << 20)  # a shrunken file is padded
                left -= len(chunk)
                yield chunk
            if size % _BLOCK:
                yield b"\0" * (_BLOCK - size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)
