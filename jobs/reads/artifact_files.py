"""What ``/v1/jobs/{id}/artifacts`` lists and serves: the files under the run's ``artifacts/`` directory and those a
script job wrote or changed in its working directory, as ``workdir/<path>`` (workdir_files.py). A file under
``artifacts/workdir/`` is served before a working-directory file of the same path.

With an object store (TORCHYARD_STORAGE_URL) both come from the store only, as the worker uploaded them (the
artifacts and the working directory when the job ended, a script's own checkpoints as it saved them:
worker/uploads.py), never from a worker's path; else from the run directory.
"""

from __future__ import annotations

from typing import BinaryIO

from jobs.reads import artifacts, workdir_files
from jobs.settings import Settings
from jobs.storage.checkpoints import job_key
from jobs.storage.store import store_for

Listed = dict[str, tuple[int, float]]  # path -> (size, modified as a POSIX time)


def _stored(settings: Settings, job_id: str, limit: int) -> tuple[Listed, Listed]:
    store = store_for(settings)
    assert store is not None
    found = store.entries(job_key(job_id, artifacts.ARTIFACTS_DIR), limit)
    written = {workdir_files.PREFIX + p: v for p, v in store.entries(job_key(job_id, workdir_files.WORKDIR_NAME), limit).items()}
    return found, written


def _local(settings: Settings, job_id: str, limit: int) -> tuple[Listed, Listed]:
    run_dir = artifacts.job_dir(settings, job_id)
    found = {p: (size, mtime) for p, size, mtime in artifacts.list_artifacts(run_dir, limit)}
    written = {p: (size, mtime) for p, size, mtime in workdir_files.list_written(run_dir, limit)}
    return found, written


def list_files(settings: Settings, job_id: str, limit: int = artifacts.MAX_LISTED) -> tuple[Listed, bool]:
    """The job's artifacts and working-directory files by path, at most ``limit`` of each (the first by path), and
    whether either held more."""
    found, written = (_stored if settings.storage_url is not None else _local)(settings, job_id, limit + 1)
    merged = dict(sorted(written.items())[:limit])
    merged.update(sorted(found.items())[:limit])  # artifacts/ wins, as served
    return dict(sorted(merged.items())), len(found) > limit or len(written) > limit


def open_file(settings: Settings, job_id: str, path: str) -> BinaryIO:
    """One of the job's artifacts or working-directory files, opened; FileNotFoundError when it has none at ``path``."""
    try:
        if settings.storage_url is None:
            return artifacts.open_artifact(artifacts.job_dir(settings, job_id), path)
        return artifacts.open_kept(settings, job_id, f"{artifacts.ARTIFACTS_DIR}/{path}")
    except FileNotFoundError:
        if settings.storage_url is None:
            return workdir_files.open_written(artifacts.job_dir(settings, job_id), path)
        if not path.startswith(workdir_files.PREFIX):
            raise
        return artifacts.open_kept(settings, job_id, path)
