"""Which files answer ``GET /v1/jobs/{id}/logs``: every rank merged, one rank as printed, one stream, or torchrun's own;
of which attempt, and when a followed log of it is complete.

The ranks write them (trainer/rank_output.py) inside torchrun's log directory ``logs/attempt-<k>/``:

    ranks.log, ranks-node-<n>.log               every rank of a node, lines prefixed "[rank R] "
    <run id>/attempt_<restart>/<local rank>/    output.log (stdout and stderr as printed), stdout.log, stderr.log
    launcher.log, launcher-node-<n>.log         torchrun's own output (the worker's redirection)

With an object store (TORCHYARD_STORAGE_URL) they are read from the store only, where the worker uploads them
(stored_logs.py), never from the API's runs directory.
"""

from __future__ import annotations

import hashlib
import re
from typing import BinaryIO

import sqlalchemy as sa
from sqlmodel import Session

from jobs.reads import artifacts, cursors, stored_logs
from jobs.reads.artifacts import FileUnavailable
from jobs.reads.job_lookup import get_job
from jobs.settings import Settings
from jobs.storage.store import store_for
from jobs.store.models import Job, Status
from jobspec.rank_logs import MERGED_LOG, OUTPUT_LOG

LAUNCHER = "launcher"
_NODE_FILE = re.compile(r"ranks-node-(\d+)\.log$")


def describe(rank: str | None, stream: str | None) -> str:
    if rank is None:
        return "log of all ranks"
    if rank == LAUNCHER:
        return "launcher log"
    return f"rank {rank} {stream or 'output'}"


def job_log(session: Session, settings: Settings, owner: str | None, job_id: str, attempt: int | None) -> tuple[Job, int]:
    """The job and the attempt whose logs are wanted (default: the current one)."""
    job = get_job(session, owner, job_id)
    attempt = job.attempt if attempt is None else attempt
    if attempt > job.attempt:
        raise FileUnavailable(f"job {job_id} has no attempt {attempt} (current attempt {job.attempt})")
    return job, attempt


def log_follow_done(session: Session, job_id: str, attempt: int) -> bool:
    """Whether a followed log of ``attempt`` is complete: the job finished or moved on to a later attempt."""
    row = session.exec(sa.select(Job.status, Job.attempt).where(Job.id == job_id)).one()  # type: ignore[call-overload]
    session.commit()  # end the read transaction so the next poll sees new commits
    return Status(row.status).terminal or row.attempt > attempt


def files(settings: Settings, job_id: str, attempt: int, rank: str | None, stream: str | None) -> list[str]:
    """The files to serve, in order, relative to the run directory; empty when none exists yet. Only names
    are looked at here: open each with ``artifacts.open_file``, which refuses a symlink anywhere on the way.

    ``rank`` None: the merged logs of all nodes (node 0 first); ``"launcher"``: torchrun's log; a number:
    that rank's ``stream`` of the newest torchrun restart, ``output`` (as printed) by default, falling back
    to stderr for a rank that died before it could set up its output (its Python did not start).

    With an object store, the names are those of its listing (StoreError when it does not answer)."""
    store = store_for(settings)
    if store is not None:
        return stored_logs.files(store, job_id, attempt, None if rank in (None, LAUNCHER) else int(rank), stream,
                                 launcher=rank == LAUNCHER)
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


def open_logs(settings: Settings, job_id: str, relatives: list[str]) -> list[tuple[str, BinaryIO]]:
    """The files of ``relatives`` that open, in order (``artifacts.open_kept``: from the object store when there is
    one, else no symlink followed and no file of several links). StoreError when the store does not answer."""
    opened: list[tuple[str, BinaryIO]] = []
    for relative in relatives:
        try:
            opened.append((relative, artifacts.open_kept(settings, job_id, relative, single_link=True)))
        except FileNotFoundError:
            continue
    return opened


# ------------------------------------------------------------ where a followed log resumes

# A followed log that reaches its maximum lifetime ends with this marker, then the position to resume from and a
# newline. The record separator (0x1e) does not occur in text a rank prints; clients strip the marker.
RECONNECT_MARKER = "\x1etorchyard-reconnect "
_OFFSET = cursors.uint_pattern(cursors.SQL_INT_MAX)
MAX_POSITION_FILES = 64
# One "<file key>:<byte offset>" per file served, joined by "."; a file of the log not named starts from its beginning.
# Empty: no file was open yet, so every file starts from its beginning.
POSITION_PATTERN = f"^(?:[0-9a-f]{{8}}:{_OFFSET}(?:\\.[0-9a-f]{{8}}:{_OFFSET}){{0,{MAX_POSITION_FILES - 1}}})?$"
POSITION_MAX = MAX_POSITION_FILES * 29 - 1
_POSITION = re.compile(POSITION_PATTERN)


def file_key(relative: str) -> str:
    """A short stable name of one log file in a position: a torchrun restart's new file has another key."""
    return hashlib.sha256(relative.encode()).hexdigest()[:8]


def encode_position(offsets: dict[str, int]) -> str:
    """The position after ``offsets`` (bytes already sent of each file, by path relative to the run directory)."""
    return ".".join(f"{file_key(relative)}:{offset}" for relative, offset in sorted(offsets.items())[:MAX_POSITION_FILES])


def decode_position(raw: str) -> dict[str, int]:
    """Byte offsets by file key; cursors.MalformedCursor (a ValueError) for anything but a position this server sent."""
    if not _POSITION.fullmatch(raw):
        raise cursors.MalformedCursor(cursors.MALFORMED_POSITION)
    return {key: int(offset) for key, offset in (part.split(":") for part in raw.split(".") if part)}
