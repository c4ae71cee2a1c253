"""``torchyard tensorboard ID [ID...]``: the jobs' TensorBoard event files in one logdir, one subdirectory per job."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from torchyard.cli.main import _settings, app, console, err, handles_errors
from torchyard.client import Client

TB_PREFIX = "tensorboard/"
WORKDIR_PREFIX = "workdir/"  # a script job's working directory: where frameworks write their event files
EVENT_FILE_MARK = "tfevents"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def run_name(job_id: str, name: str | None) -> str:
    """The job's subdirectory: its name and id, so TensorBoard's run list says which job is which."""
    return _UNSAFE.sub("_", f"{name}-{job_id}" if name else job_id)


def local_path(artifact: str) -> Path | None:
    """Where an artifact goes under the job's subdirectory: the SDK's artifacts/tensorboard/ files at its top, event
    files the job wrote anywhere in its working directory under ``workdir/`` as they lay; None for anything else."""
    if artifact.startswith(TB_PREFIX):
        relative = Path(artifact[len(TB_PREFIX):])
    elif artifact.startswith(WORKDIR_PREFIX) and EVENT_FILE_MARK in artifact.rsplit("/", 1)[-1]:
        relative = Path(artifact)
    else:
        return None
    if ".." in relative.parts or relative.is_absolute() or not relative.parts:
        return None  # never written outside the logdir, whatever a server answers
    return relative


def download(client: Client, job_ids: list[str], logdir: Path) -> dict[str, list[Path]]:
    """Each job's event files (local_path) into ``logdir/<name>-<id>/``; what was written, per job id."""
    written: dict[str, list[Path]] = {}
    for job_id in job_ids:
        job = client.job(job_id)
        target = logdir / run_name(job.id, job.name)
        written[job.id] = []
        for artifact in client.artifacts(job.id):
            relative = local_path(artifact.path)
            if relative is not None:
                written[job.id].append(client.download_artifact(job.id, artifact.path, target / relative))
    return written


def command(logdir: Path, port: int | None) -> list[str]:
    """How to start TensorBoard on ``logdir`` with this interpreter (the tensorboard package pinned with torchyard)."""
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
    return cmd + (["--port", str(port)] if port else [])


def shell(cmd: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in cmd)


@app.command()
@handles_errors
def tensorboard(
    ctx: typer.Context,
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.", show_default=False)],
    logdir: Annotated[Path | None, typer.Option("--logdir", help="Where the event files go (one subdirectory per job); "
                                                                 "default a new temporary directory.", show_default=False)] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="TensorBoard's port; default its own (6006).",
                                             show_default=False)] = None,
    print_only: Annotated[bool, typer.Option("--print", help="Download, then print the tensorboard command instead of "
                                                             "running it.")] = False,
) -> None:
    """Download the jobs' TensorBoard event files into one logdir and start TensorBoard on it."""
    target = logdir if logdir is not None else Path(tempfile.mkdtemp(prefix="torchyard-tb-"))
    written = download(_settings(ctx).client(), job_ids, target)
    for job_id, files in written.items():
        if not files:
            err.print(f"[yellow]job {escape(job_id)} has no TensorBoard event files (yet)[/]")
    cmd = command(target, port)
    if print_only:
        console.print(shell(cmd), markup=False)
        return
    err.print(f"TensorBoard on {escape(str(target))}: {escape(shell(cmd))}")
    raise typer.Exit(subprocess.call(cmd))
