"""Before a script job's ranks start: its uploaded bundle unpacked into the run directory, its working directory
copied from it (worker/workdir.py), and its requirements environment built (or found in the cache). Failures
become ``setup_error``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from jobs.code_bundles import files as bundles
from jobs.settings import Settings
from jobs.store.models import Job
from jobspec.spec import JobSpec, ScriptJobSpec
from worker import venvs, workdir
from worker.venvs import SetupFailed, SetupInterrupted

log = logging.getLogger(__name__)

REQUIREMENTS_LOG = "requirements.log"  # pip's output, next to the attempt's launcher log

__all__ = ["REQUIREMENTS_LOG", "SetupFailed", "SetupInterrupted", "prepare"]


def prepare(settings: Settings, job: Job, spec: JobSpec | ScriptJobSpec, run_dir: Path, keep_going: Callable[[], bool]) -> None:
    """Unpack the job's bundle, copy its working directory and build its environment; SetupFailed says why not, SetupInterrupted
    when ``keep_going`` (polled while pip runs or another job builds the same environment) says stop."""
    if not isinstance(spec, ScriptJobSpec):
        return
    if spec.code is not None:
        try:
            bundles.unpack_for_job(settings, job.owner, spec.code, run_dir)
        except (bundles.BundleMissing, bundles.BundleRefused) as exc:
            raise SetupFailed(f"code bundle: {exc}") from exc
    workdir.make(settings, spec, run_dir)
    if spec.requirements:
        log_file = run_dir / "logs" / f"attempt-{job.attempt}" / REQUIREMENTS_LOG
        python = venvs.ensure(settings, spec.requirements, log_file, keep_going)
        log.info("job %s: requirements environment %s", job.id, python, extra={"job_id": job.id})
