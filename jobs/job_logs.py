"""Which files answer ``GET /v1/jobs/{id}/logs``: every rank merged, one rank as printed, one stream, or torchrun's own.

The ranks write them (trainer/rank_output.py) inside torchrun's log directory ``logs/attempt-<k>/``:

    ranks.log, ranks-node-<n>.log               every rank of a node, lines prefixed "[rank R] "
    <run id>/attempt_<restart>/<local rank>/    output.log (stdout and stderr as printed), stdout.log, stderr.log
    launcher.log, launcher-node-<n>.log         torchrun's own output (the worker's redirection)
"""

from __future__ import annotations

import re

from jobs import artifacts
from jobs.settings import Settings
from trainer.rank_output import MERGED_LOG, OUTPUT_LOG

LAUNCHER = "launcher"
_NODE_FILE = re.compile(r"ranks-node-(\d+)\.log$")


def describe(rank: str | None, stream: str | None) -> str:
    if rank is None:
        return "log of all ranks"
    if rank == LAUNCHER:
        return "launcher log"
    return f"rank {rank} {stream or 'output'}"


def files(settings: Settings, job_id: str, attempt: int, rank: str | None, stream: str | None) -> list[str]:
    """The files to serve, in order, relative to the run directory; empty when none exists yet. Only names
    are looked at here: open each with ``artifacts.open_file``, which refuses a symlink anywhere on the way.

    ``rank`` None: the merged logs of all nodes (node 0 first); ``"launcher"``: torchrun's log; a number:
    that rank's ``stream`` of the newest torchrun restart, ``output`` (as printed) by default, falling back
    to stderr for a rank that died before it could set up its output (its Python did not start)."""
    if rank == LAUNCHER:
        launcher = artifacts.log_file(settings, job_id, attempt, None)
        return [launcher] if launcher is not None else []
    if rank is not None:
        wanted = stream or OUTPUT_LOG.removesuffix(".log")
        relative = artifacts.log_file(settings, job_id, attempt, int(rank), wanted)
        if relative is None and stream is None:
            relative = artifacts.log_file(settings, job_id, attempt, int(rank), "stderr")
        return [relative] if relative is not None else []
    base = f"logs/attempt-{attempt}"
    attempt_dir = artifacts.job_dir(settings, job_id) / base
    if attempt_dir.is_symlink() or not attempt_dir.is_dir():
        return []
    found: list[tuple[int, str]] = []
    for path in attempt_dir.glob("ranks*.log"):
        match = _NODE_FILE.match(path.name)
        if path.name == MERGED_LOG:
            found.append((0, path.name))
        elif match:
            found.append((int(match.group(1)), path.name))
    return [f"{base}/{name}" for _, name in sorted(found)]
