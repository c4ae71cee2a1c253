"""The consolidated weights file of a job's checkpoint, opened for the API to serve (``GET /v1/jobs/{id}/weights``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sqlmodel import Session

from jobs.reads import artifacts
from jobs.reads.artifacts import FileUnavailable
from jobs.reads.job_lookup import checkpoints, get_job
from jobs.settings import Settings
from jobs.storage.stored_file import size_of
from jobs.store.models import Checkpoint

log = logging.getLogger(__name__)


@dataclass
class OpenedFile:
    """A file the API serves, already open (served from this descriptor, never from its path again)."""

    file: BinaryIO
    size: int
    name: str  # the file's own name, for Content-Disposition


def weights_file(session: Session, settings: Settings, owner: str | None, job_id: str,
                 step: int | None = None) -> tuple[Checkpoint, OpenedFile]:
    """The consolidated weights of checkpoint ``step``, or of the latest checkpoint that has them, opened."""
    job = get_job(session, owner, job_id)
    saved = [c for c in checkpoints(session, job_id) if step is None or c.step == step]
    if not saved:
        raise FileUnavailable(f"job {job_id} has no checkpoint" + (f" at step {step}" if step is not None else ""))
    with_weights = [c for c in saved if isinstance(c.details.get("weights"), str)]
    if not with_weights and job.spec.get("kind") == "script":
        latest = saved[-1]
        where = str(Path(job.run_dir) / latest.path) if job.run_dir else latest.path
        # A directory found in the run (a Trainer's checkpoint-N) downloads whole, as one tar, by its step.
        whole = (f"; `torchyard download {job_id} --step {latest.step}` downloads that directory as one tar"
                 if latest.details.get("found") else "")
        raise FileUnavailable(
            f"job {job_id} is a script job: its checkpoints hold what its script saved, and torchyard makes no consolidated "
            f"weights file of them; step {latest.step} is {where} on the runs volume (`torchyard status {job_id}` lists "
            f"every checkpoint's path){whole}; a file the script writes under artifacts/ downloads with "
            f"`torchyard artifacts {job_id} --get PATH`")
    if not with_weights:
        raise FileUnavailable(f"job {job_id}: no consolidated weights file" + (f" at step {step}" if step is not None else "")
                              + "; the final checkpoint of a finished job has one")
    ckpt = with_weights[-1]
    relative = ckpt.details["weights"]
    try:
        f = artifacts.open_kept(settings, job_id, relative)
    except FileNotFoundError:
        log.warning("job %s: weights file %r is missing or not a plain file under the run directory", job_id, relative,
                    extra={"job_id": job_id})
        raise FileUnavailable(f"job {job_id}: the weights file of step {ckpt.step} is not available") from None
    return ckpt, OpenedFile(f, size_of(f), Path(relative).name)
