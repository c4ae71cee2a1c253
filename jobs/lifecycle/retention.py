"""Expiry of old run directories: disk use must not only grow.

Run directories of jobs that finished more than ``TORCHYARD_RUN_RETENTION_DAYS`` ago are removed, and their objects
in the store (TORCHYARD_STORAGE_URL: jobs/storage/job_objects.py); with
``TORCHYARD_RUN_RETENTION_KEEP_WEIGHTS`` the final consolidated weights file stays (the job's
``/weights`` keeps answering). The job's rows (metrics, checkpoints' history) stay: ``DELETE /v1/jobs/{id}``
removes those. Every worker and the API run it from the reconciler loop; removal is idempotent.
"""

from __future__ import annotations

import logging
import shutil
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlmodel import Session

from jobs.settings import Settings
from jobs.storage import job_objects
from jobs.store.models import Checkpoint, Job, Status, utcnow

log = logging.getLogger(__name__)

_TERMINAL = [Status.SUCCEEDED.value, Status.FAILED.value, Status.CANCELLED.value]


def expire_run_dirs(session: Session, settings: Settings) -> list[str]:
    """Apply the retention setting once; the ids of the jobs whose run directory lost files."""
    if settings.run_retention_days is None:
        return []
    cutoff = utcnow() - timedelta(days=settings.run_retention_days)
    rows = session.exec(  # type: ignore[call-overload]
        sa.select(Job.id, Job.run_dir).where(Job.status.in_(_TERMINAL), Job.finished_at < cutoff,  # type: ignore[attr-defined]
                                             Job.run_dir.is_not(None))  # type: ignore[union-attr]
    ).all()
    session.commit()
    root = settings.runs_dir.resolve()
    expired = []
    for job_id, run_dir in rows:
        job_objects.expire(settings, job_id, _weights_relative(session, job_id) if settings.run_retention_keep_weights else None)
        path = Path(run_dir).resolve()
        if path.parent != root or not path.is_dir():
            continue  # gone already, or not a run directory this service owns
        keep = _final_weights(session, job_id, path) if settings.run_retention_keep_weights else None
        if _prune(path, keep):
            log.info("job %s: run directory expired (%s)", job_id, f"kept {keep}" if keep else "removed",
                     extra={"job_id": job_id})
            expired.append(job_id)
    return expired


def _weights_relative(session: Session, job_id: str, run_dir: Path | None = None) -> str | None:
    """Where the job's final consolidated weights are in its run directory (and, given ``run_dir``, are there)."""
    saved = session.exec(  # type: ignore[call-overload]
        sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc())  # type: ignore[attr-defined]
    ).scalars().all()
    session.commit()
    for ckpt in saved:
        relative = ckpt.details.get("weights")
        if isinstance(relative, str):
            if run_dir is None:
                return relative
            path = (run_dir / relative).resolve()
            if path.is_relative_to(run_dir) and path.is_file():
                return relative
    return None


def _final_weights(session: Session, job_id: str, run_dir: Path) -> Path | None:
    relative = _weights_relative(session, job_id, run_dir)
    return (run_dir / relative).resolve() if relative else None


def _prune(directory: Path, keep: Path | None) -> bool:
    """Remove everything under ``directory`` but ``keep`` (and the folders leading to it); True when anything went."""
    if keep is None:
        shutil.rmtree(directory, ignore_errors=True)
        return True
    removed = False
    for entry in directory.iterdir():
        if entry == keep:
            continue
        if entry.is_dir() and not entry.is_symlink() and keep.is_relative_to(entry):
            removed = _prune(entry, keep) or removed
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed = True
        else:
            entry.unlink(missing_ok=True)
            removed = True
    return removed
