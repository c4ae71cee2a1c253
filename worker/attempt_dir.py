"""The run directory made ready for one attempt: earlier plants scrubbed, spec.json as placed, the log folder,
and a retried catalog job's checkpoint adopted from the job it resumes."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from jobspec.spec import AnySpec
from torchyard.atomic import write_atomic
from worker.launch import ERROR_FILE, SPEC_FILE
from worker.sandbox import run_dirs

log = logging.getLogger(__name__)


def prepare(run_dir: Path, attempt: int, spec: AnySpec, resume_from: str | None) -> None:
    """Raises OSError (ENOSPC with the file named) when the volume is full."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dirs.scrub(run_dir, attempt)  # what an earlier attempt planted where the worker writes
    (run_dir / "logs" / f"attempt-{attempt}").mkdir(parents=True, exist_ok=True)
    # As placed on this worker: nproc_per_node 'gpu' is a number here.
    write_atomic(run_dir / SPEC_FILE, json.dumps(spec.visible_dump(), indent=2))
    (run_dir / ERROR_FILE).unlink(missing_ok=True)
    # Catalog checkpoints are adopted into the run directory; a script finds its own via report.resume_path().
    if spec.kind == "catalog" and resume_from and not (run_dir / "checkpoints" / "latest").exists():
        adopt_checkpoint(Path(resume_from), run_dir / "checkpoints")


def adopt_checkpoint(source: Path, checkpoints: Path) -> None:
    """Start a retried job from another job's checkpoint: hard-link its files (no copy of the
    weights), then point ``latest`` at it, as the trainer's own checkpoints are laid out."""
    if not source.is_dir():
        log.warning("checkpoint %s to resume from is gone; starting from scratch", source)
        return
    checkpoints.mkdir(parents=True, exist_ok=True)
    target = checkpoints / source.name
    if not target.exists():
        try:
            shutil.copytree(source, target, copy_function=os.link)
        except OSError:
            shutil.copytree(source, target)  # another filesystem: links are impossible
    write_atomic(checkpoints / "latest", source.name)

