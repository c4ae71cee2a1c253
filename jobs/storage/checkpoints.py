"""A job's files in the store, laid out as its run directory is: ``<prefix>/jobs/<job id>/<path in the run directory>``.

Checkpoints go up whole, the manifest last (``manifest.py``), and come down only once complete, each file checked
against the manifest's size; a job's objects go with it.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

from jobs.reads.artifacts import open_under, plain_parts
from jobs.storage.manifest import MANIFEST_NAME, Manifest, ManifestError, complete, manifest_key, newest_complete, step_of
from jobs.storage.store import NotInStore, ObjectStore, StoreError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"


def job_key(job_id: str, relative: str = "") -> str:
    """The key of a path of the job's run directory (the job's folder when ``relative`` is empty)."""
    return f"jobs/{job_id}/{relative}".rstrip("/")


def checkpoint_files(local: Path) -> dict[str, int]:
    """Every regular file under the checkpoint directory ``local`` (symlinks neither listed nor followed) -> size."""
    files: dict[str, int] = {}
    for dirpath, dirs, names in os.walk(local, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            full = Path(dirpath, name)
            st = full.lstat()
            if stat.S_ISREG(st.st_mode) and name != MANIFEST_NAME:
                files[full.relative_to(local).as_posix()] = st.st_size
    return files


def upload_checkpoint(store: ObjectStore, job_id: str, local: Path) -> Manifest:
    """Upload the committed checkpoint directory ``local`` (``checkpoints/<name>`` of the run directory), then its
    manifest. OSError when a file vanished (pruned meanwhile) or is not a plain file, StoreError when the store failed: no manifest is
    written then, so the partial upload never counts."""
    base = f"{CHECKPOINTS}/{local.name}"
    files = checkpoint_files(local)
    for relative, size in files.items():
        # Opened without following a link anywhere (a job may have planted one): only the job's own bytes go up.
        with open_under(local, relative) as f:
            sent = store.put_open(job_key(job_id, f"{base}/{relative}"), f)
        if sent != size:  # rewritten since it was listed: not the checkpoint that was committed
            raise OSError(f"checkpoint {local.name}: {relative} changed during its upload")
    manifest = Manifest(local.name, files, step_of(local.name))
    store.put_bytes(job_key(job_id, f"{CHECKPOINTS}/{manifest_key(local.name)}"), manifest.to_json())
    log.info("job %s: checkpoint %s uploaded (%d files, %d bytes)", job_id, local.name, len(files), manifest.size,
             extra={"job_id": job_id})
    return manifest


def stored_checkpoints(store: ObjectStore, job_id: str) -> tuple[list[Manifest], dict[str, int]]:
    """The manifests of the job's checkpoints in the store that can be read, and the listing of its checkpoints/."""
    listing = store.list(job_key(job_id, CHECKPOINTS))
    manifests = []
    for key in listing:
        name, _, rest = key.partition("/")
        if rest != MANIFEST_NAME:
            continue
        try:
            manifests.append(Manifest.from_json(name, store.get_bytes(job_key(job_id, f"{CHECKPOINTS}/{key}"))))
        except (ManifestError, NotInStore) as exc:  # deleted since the listing, or not ours: not a checkpoint
            log.warning("job %s: %s", job_id, exc, extra={"job_id": job_id})
    return manifests, listing


def complete_stored(store: ObjectStore, job_id: str, name: str) -> Manifest:
    """The manifest of checkpoint ``checkpoints/<name>`` once it is complete in the store; NotInStore when its
    manifest is not there, ManifestError when it cannot be read or a file it names is missing or of another size."""
    manifest = Manifest.from_json(name, store.get_bytes(job_key(job_id, f"{CHECKPOINTS}/{manifest_key(name)}")))
    listing = store.list(job_key(job_id, f"{CHECKPOINTS}/{name}"))
    if not complete(manifest, {f"{name}/{key}": size for key, size in listing.items()}):
        raise ManifestError(f"checkpoint {name}: not every file is in the store")
    return manifest


def newest_stored(store: ObjectStore, job_id: str) -> Manifest | None:
    """The job's newest complete checkpoint in the store; None when it has none."""
    return newest_complete(*stored_checkpoints(store, job_id))


def download_checkpoint(store: ObjectStore, job_id: str, manifest: Manifest, checkpoints: Path) -> Path:
    """Download the complete checkpoint ``manifest`` names into ``checkpoints/<name>``: into a temporary directory
    first, every file checked against its size in the manifest, then renamed into place, so the directory is whole
    or absent. StoreError where the store failed or holds other bytes than the manifest says."""
    target = checkpoints / manifest.name
    tmp = checkpoints / f".download-{manifest.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for relative, size in manifest.files.items():
            try:  # the run directory's own rule for a path below a root: no absolute path, no '..', no NUL
                dest = tmp.joinpath(*plain_parts(relative))
            except FileNotFoundError:
                raise StoreError(f"checkpoint {manifest.name}: the manifest names a path outside it") from None
            dest.parent.mkdir(parents=True, exist_ok=True)
            got = store.get_file(job_key(job_id, f"{CHECKPOINTS}/{manifest.name}/{relative}"), dest)
            if got != size:
                raise StoreError(f"checkpoint {manifest.name}: {relative} is {got} bytes in the store, the manifest says {size}")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("job %s: checkpoint %s downloaded (%d bytes)", job_id, manifest.name, manifest.size, extra={"job_id": job_id})
    return target


def delete_checkpoint(store: ObjectStore, job_id: str, name: str) -> None:
    """Remove checkpoint ``checkpoints/<name>`` from the store: its manifest first, so what is left is never complete."""
    store.delete(job_key(job_id, f"{CHECKPOINTS}/{manifest_key(name)}"))
    store.delete_prefix(job_key(job_id, f"{CHECKPOINTS}/{name}"))


def delete_job(store: ObjectStore, job_id: str, keep: str | None = None) -> int:
    """Remove every object of the job but ``keep`` (a path in its run directory: the final weights retention keeps);
    how many there were."""
    return store.delete_prefix(job_key(job_id), keep=(keep,) if keep else ())
