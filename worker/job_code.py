"""Before a script job's ranks start: its uploaded bundle unpacked into the run directory, its working directory
copied from it (worker/workdir.py), and its requirements environment built (or found in the cache). Failures
become ``setup_error``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from jobs.code_bundles import files as bundles
from jobs.code_bundles import stored as stored_bundles
from jobs.settings import Settings
from jobs.storage.store import StoreError, until_answered
from jobs.store.models import Job
from jobspec.spec import JobSpec, ScriptJobSpec
from worker import venvs, workdir
from worker.venvs import SetupFailed, SetupInterrupted

log = logging.getLogger(__name__)

REQUIREMENTS_LOG = "requirements.log"  # pip's output, next to the attempt's launcher log

FETCH_WAIT_S = 120.0  # how long a start waits for an object store that does not answer before the job fails

__all__ = ["REQUIREMENTS_LOG", "SetupFailed", "SetupInterrupted", "prepare"]


def _fetch_bundle(settings: Settings, owner: str, digest: str, run_dir: Path, keep_going: Callable[[], bool]) -> None:
    """On a host that does not share the API's bundles directory, the archive from the object store (a no-op where the
    job's code is unpacked already, the archive is here, or there is no store)."""
    if settings.storage_url is None or (run_dir / bundles.CODE_DIR_NAME).is_dir():
        return
    try:
        until_answered(lambda: stored_bundles.fetch(settings, owner, digest), keep_going, FETCH_WAIT_S)
    except StoreError as exc:
        if not keep_going():
            raise SetupInterrupted() from exc
        raise SetupFailed(f"code bundle {digest}: not on this host, and the object store did not answer "
                          f"for {FETCH_WAIT_S:.0f}s ({exc})") from exc


def prepare(settings: Settings, job: Job, spec: JobSpec | ScriptJobSpec, run_dir: Path, keep_going: Callable[[], bool]) -> None:
    """Unpack the job's bundle, copy its working directory and build its environment; SetupFailed says why not, SetupInterrupted
    when ``keep_going`` (polled while pip runs or another job builds the same environment) says stop."""
    if not isinstance(spec, ScriptJobSpec):
        return
    if spec.code is not None:
        _fetch_bundle(settings, job.owner, spec.code, run_dir, keep_going)
        try:
            bundles.unpack_for_job(settings, job.owner, spec.code, run_dir)
        except (bundles.BundleMissing, bundles.BundleRefused) as exc:
            raise SetupFailed(f"code bundle: {exc}") from exc
    workdir.make(settings, spec, run_dir)
    if spec.requirements:
        log_file = run_dir / "logs" / f"attempt-{job.attempt}" / REQUIREMENTS_LOG
        python = venvs.ensure(settings, spec.requirements, log_file, keep_going)
        log.info("job %s: requirements environment %s", job.id, python, extra={"job_id": job.id})
