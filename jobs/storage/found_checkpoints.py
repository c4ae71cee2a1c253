"""Checkpoints a script's framework wrote by itself (worker/checkpoints_found.py: nanoGPT's ``out/ckpt.pt``, a Trainer's
``checkpoint-N/``, Lightning's ``last.ckpt``) in the object store, so a script resumes on a host that never saw them.

Their files go up at their own paths in the run directory's layout (``jobs/<id>/workdir/out/ckpt.pt``), where the API
serves them from as any of the job's files, and a manifest last, ``jobs/<id>/found-checkpoints/<version>.json``: the
files with their sizes and the step. A version names the checkpoint's path and when it was written, so a file the
script overwrites at each save (nanoGPT's ``ckpt.pt``) gets one manifest per save; the older ones of the same path go
once a newer one is in. A checkpoint counts as resumable only once its manifest is there and every file it names is
in the store at that size (manifest.py), so a half-uploaded one is never resumed from.

Before a resuming attempt's ranks start, the newest complete one comes down into the run directory at its own path,
with the time it was written, so the worker finds it there as it finds a checkpoint of its own (and hands it to the
script through ``resume_args``). Each directory on the way is opened without following links: what a job planted in
its directory never takes the worker's writes elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from jobs.reads.artifacts import open_under, plain_parts
from jobs.storage.checkpoints import checkpoint_files, job_key
from jobs.storage.manifest import Manifest, ManifestError
from jobs.storage.store import NotInStore, ObjectStore, StoreError

log = logging.getLogger(__name__)

FOUND = "found-checkpoints"
_NO_FOLLOW_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY


def version_of(relative: str, mtime: float) -> str:
    """The manifest's name: when the checkpoint was written, in microseconds (so names sort by time, and a checkpoint
    restored with that time has the same name on its new host), then which path it is (pure)."""
    return f"{round(mtime * 1e6):017d}-{_path_hash(relative)}"


def _path_hash(relative: str) -> str:
    return hashlib.sha256(relative.encode()).hexdigest()[:16]


def _path_id(version: str) -> str:
    """The path hash a version names."""
    return version.partition("-")[2]


def _mtime_ns(version: str) -> int:
    return int(version.partition("-")[0]) * 1000


def _files(run_dir: Path, relative: str) -> dict[str, int]:
    """The regular files of the checkpoint at ``relative`` (a file or a directory), path in the run directory -> size;
    links neither listed nor followed."""
    root = run_dir.joinpath(*plain_parts(relative))
    st = root.lstat()
    if stat.S_ISREG(st.st_mode):
        return {relative: st.st_size}
    if not stat.S_ISDIR(st.st_mode):
        raise FileNotFoundError(relative)
    return {f"{relative}/{path}": size for path, size in checkpoint_files(root).items()}


def upload_found(store: ObjectStore, job_id: str, run_dir: Path, relative: str, mtime: float,
                 step: int | None) -> dict[str, tuple[int, int]] | None:
    """Upload the found checkpoint at ``relative`` as written at ``mtime`` (its newest file's time), then its manifest;
    the files sent, path -> (size, mtime_ns), or None when this version is in the store already. OSError when a file
    vanished or changed meanwhile (the script saved again: the next pass sends the newer one), StoreError when the
    store failed: no manifest is written then."""
    version = version_of(relative, mtime)
    manifest_key = job_key(job_id, f"{FOUND}/{version}.json")
    if store.size(manifest_key) is not None:
        return None
    files = _files(run_dir, relative)
    if any(run_dir.joinpath(*plain_parts(path)).lstat().st_mtime > mtime for path in files):
        raise OSError(f"found checkpoint {relative}: saved again since it was found")  # before sending any byte of it
    sent: dict[str, tuple[int, int]] = {}
    for path, size in files.items():
        with open_under(run_dir, path, single_link=True) as f:
            store.put_open(job_key(job_id, path), f)
        st = run_dir.joinpath(*plain_parts(path)).lstat()  # the upload closed ``f``; a save rewrites the file in place
        if st.st_size != size or st.st_mtime > mtime:  # rewritten since it was found: not the checkpoint that was
            raise OSError(f"found checkpoint {relative}: {path} changed during its upload")
        sent[path] = (st.st_size, st.st_mtime_ns)
    store.put_bytes(manifest_key, Manifest(version, files, step).to_json())
    for older in _versions(store, job_id):
        if _path_id(older) == _path_id(version) and older < version:  # the same path saved again: its bytes are the new ones
            store.delete(job_key(job_id, f"{FOUND}/{older}.json"))
    log.info("job %s: found checkpoint %s (step %s) uploaded (%d files, %d bytes)", job_id, relative, step, len(files),
             sum(files.values()), extra={"job_id": job_id})
    return sent


def _versions(store: ObjectStore, job_id: str) -> list[str]:
    return sorted(key.removesuffix(".json") for key in store.list(job_key(job_id, FOUND)) if key.endswith(".json"))


def _manifests(store: ObjectStore, job_id: str) -> list[Manifest]:
    manifests = []
    for version in _versions(store, job_id):
        try:
            manifests.append(Manifest.from_json(version, store.get_bytes(job_key(job_id, f"{FOUND}/{version}.json"))))
        except (NotInStore, ManifestError) as exc:  # deleted since the listing, or not ours: not a checkpoint
            log.warning("job %s: %s", job_id, exc, extra={"job_id": job_id})
    return manifests


def newest_found(store: ObjectStore, job_id: str) -> Manifest | None:
    """The newest complete found checkpoint in the store: the highest step, then the newest written (a checkpoint whose
    step is unknown sorts below every step); None when there is none."""
    for manifest in sorted(_manifests(store, job_id), key=lambda m: (m.step if m.step is not None else -1, m.name),
                           reverse=True):
        if _is_complete(store, job_id, manifest):
            return manifest
    return None


def _is_complete(store: ObjectStore, job_id: str, manifest: Manifest) -> bool:
    return all(store.size(job_key(job_id, path)) == size for path, size in manifest.files.items())


def stored_tree(store: ObjectStore, job_id: str, relative: str) -> list[str] | None:
    """The files of the found checkpoint at ``relative`` (paths in the run directory) as the newest complete version of
    it in the store lists them; None when the store holds no complete version."""
    path_id = _path_hash(relative)
    for manifest in sorted(_manifests(store, job_id), key=lambda m: m.name, reverse=True):
        if _path_id(manifest.name) == path_id and _is_complete(store, job_id, manifest):
            return sorted(manifest.files)
    return None


def delete_found(store: ObjectStore, job_id: str, relative: str) -> None:
    """Remove every version of the found checkpoint at ``relative`` from the store (the framework pruned it: a Trainer's
    ``save_total_limit``): each manifest first, so what is left is never complete, then the files it named."""
    path_id = _path_hash(relative)
    for manifest in _manifests(store, job_id):
        if _path_id(manifest.name) == path_id:
            store.delete(job_key(job_id, f"{FOUND}/{manifest.name}.json"))
            for path in manifest.files:
                store.delete(job_key(job_id, path))


@contextlib.contextmanager
def _directory(run_dir: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of ``run_dir/<parts>``, each directory made where missing and opened without following a link;
    OSError (ELOOP, ENOTDIR) where the job put a link or a file in the way."""
    fd = os.open(run_dir, _NO_FOLLOW_DIR)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o770, dir_fd=fd)
            child = os.open(part, _NO_FOLLOW_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def restore_found(store: ObjectStore, job_id: str, run_dir: Path) -> Manifest | None:
    """Bring the newest complete found checkpoint of the store into the run directory, unless every file of it is here
    already; the manifest restored, or None. Each file is downloaded whole and checked against the manifest's size
    first, then renamed into place with the time it was written. StoreError when the store failed or holds other
    bytes; OSError when the job put a link or a file where a directory of the checkpoint goes."""
    manifest = newest_found(store, job_id)
    if manifest is None:
        return None
    mtime_ns = _mtime_ns(manifest.name)

    def here(path: str, size: int) -> bool:
        with contextlib.suppress(OSError), open_under(run_dir, path, single_link=True) as f:
            st = os.fstat(f.fileno())
            return st.st_size == size and st.st_mtime_ns >= mtime_ns
        return False

    if all(here(path, size) for path, size in manifest.files.items()):
        return None
    tmp = run_dir / f".found-{secrets.token_hex(6)}"
    tmp.mkdir(mode=0o700)
    try:
        for i, (path, size) in enumerate(sorted(manifest.files.items())):
            try:
                parts = plain_parts(path)
            except FileNotFoundError:
                raise StoreError(f"found checkpoint {manifest.name}: the manifest names a path outside the run") from None
            got = store.get_file(job_key(job_id, path), tmp / str(i))
            if got != size:
                raise StoreError(f"found checkpoint {manifest.name}: {path} is {got} bytes in the store, the manifest "
                                 f"says {size}")
            with _directory(run_dir, parts[:-1]) as fd:
                os.replace(tmp / str(i), parts[-1], dst_dir_fd=fd)
                os.utime(parts[-1], ns=(mtime_ns, mtime_ns), dir_fd=fd, follow_symlinks=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("job %s: found checkpoint %s (step %s) downloaded from the object store (%d files, %d bytes)", job_id,
             ", ".join(sorted(manifest.files))[:200], manifest.step, len(manifest.files), manifest.size,
             extra={"job_id": job_id})
    return manifest
