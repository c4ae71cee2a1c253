"""``torchyard tensorboard ID [ID...]``: the jobs' TensorBoard event files in one logdir, one subdirectory per job."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from client import Client

TB_PREFIX = "tensorboard/"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def run_name(job_id: str, name: str | None) -> str:
    """The job's subdirectory: its name and id, so TensorBoard's run list says which job is which."""
    return _UNSAFE.sub("_", f"{name}-{job_id}" if name else job_id)


def download(client: Client, job_ids: list[str], logdir: Path) -> dict[str, list[Path]]:
    """Each job's files under artifacts/tensorboard/ into ``logdir/<name>-<id>/``; what was written, per job id."""
    written: dict[str, list[Path]] = {}
    for job_id in job_ids:
        job = client.job(job_id)
        target = logdir / run_name(job.id, job.name)
        written[job.id] = []
        for artifact in client.artifacts(job.id):
            if artifact.path.startswith(TB_PREFIX):
                relative = Path(artifact.path[len(TB_PREFIX):])
                if ".." in relative.parts or relative.is_absolute():
                    continue  # never written outside the logdir, whatever a server answers
                written[job.id].append(client.download_artifact(job.id, artifact.path, target / relative))
    return written


def command(logdir: Path, port: int | None) -> list[str]:
    """How to start TensorBoard on ``logdir`` with this interpreter (the tensorboard package pinned with torchyard)."""
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
    return cmd + (["--port", str(port)] if port else [])


def shell(cmd: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in cmd)
