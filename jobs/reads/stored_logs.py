"""A job's logs as the object store holds them (TORCHYARD_STORAGE_URL), named as in its run directory
(``logs/attempt-<k>/...``, see job_logs.py), found by listing the attempt's folder instead of a directory.

The worker that ran an attempt uploads its logs every TORCHYARD_STORAGE_SYNC_INTERVAL_S and once more before the
verdict (worker/uploads.py), so what is read here is at most that much behind the ranks, and an attempt whose host
died is readable as far as its last upload went: the API needs no worker's disk.
"""

from __future__ import annotations

import re

from jobs.reads.artifacts import LAUNCHER_LOG, MAX_LISTED
from jobs.storage.checkpoints import job_key
from jobs.storage.store import NotInStore, ObjectStore
from jobspec.rank_logs import MERGED_LOG, RANK_MARK

_NODE_FILE = re.compile(r"ranks-node-(\d+)\.log$")
# torchrun --log-dir D --redirects=3: D/<run id>/attempt_<restart>/<local rank>/<file>
_RANK_FILE = re.compile(r"^([^/]+)/attempt_(\d+)/(\d+)/([^/]+)$")
_MARK_MAX = 32  # a rank mark is a number; anything longer is not one


def attempt_base(attempt: int) -> str:
    return f"logs/attempt-{attempt}"


def listing(store: ObjectStore, job_id: str, attempt: int) -> dict[str, tuple[int, float]]:
    """The attempt's log objects: path relative to ``logs/attempt-<k>/`` -> (size, modified)."""
    return store.entries(job_key(job_id, attempt_base(attempt)), MAX_LISTED)


def merged(found: dict[str, tuple[int, float]]) -> list[str]:
    """Every node's merged log of the listing, node 0 first, as names relative to the attempt's folder."""
    nodes: list[tuple[int, str]] = []
    for name in found:
        match = _NODE_FILE.fullmatch(name)
        if name == MERGED_LOG:
            nodes.append((0, name))
        elif match:
            nodes.append((int(match.group(1)), name))
    return [name for _, name in sorted(nodes)]


def rank_dir(found: dict[str, tuple[int, float]], rank: int, marks: dict[str, int]) -> str | None:
    """The folder of global rank ``rank``'s files of the newest launch and its highest restart, the rule of
    jobspec.rank_logs.find_rank_dir read from a listing: a folder's ``rank`` mark (``marks``: folder -> the number
    it holds) names its global rank, a folder without one counts under its local rank. A launch's time is that of
    the newest object of its run-id folder (the one still written to)."""
    launched: dict[str, float] = {}
    folders: dict[str, tuple[str, int, int]] = {}  # folder -> (run id, restart, local rank)
    for name, (_size, modified) in found.items():
        match = _RANK_FILE.fullmatch(name)
        if match is None:
            continue
        run_id, restart, local, _file = match.groups()
        launched[run_id] = max(launched.get(run_id, modified), modified)
        folders[name.rsplit("/", 1)[0]] = (run_id, int(restart), int(local))
    candidates = [(launched[run_id], restart, folder) for folder, (run_id, restart, local) in folders.items()
                  if marks.get(folder, local) == rank]
    return max(candidates)[2] if candidates else None


def read_marks(store: ObjectStore, job_id: str, attempt: int, found: dict[str, tuple[int, float]]) -> dict[str, int]:
    """The global rank each folder's ``rank`` mark holds (folder -> rank); a mark that is gone or not a number is
    left out, so its folder counts under its local rank, as on disk."""
    marks: dict[str, int] = {}
    for name, (size, _modified) in found.items():
        folder, _, file = name.rpartition("/")
        if file != RANK_MARK or size > _MARK_MAX or not _RANK_FILE.fullmatch(name):
            continue
        try:
            text = store.get_bytes(job_key(job_id, f"{attempt_base(attempt)}/{name}")).decode("ascii", "replace")
            marks[folder] = int(text.strip())
        except (NotInStore, ValueError):
            continue
    return marks


def files(store: ObjectStore, job_id: str, attempt: int, rank: int | None, stream: str | None, launcher: bool) -> list[str]:
    """As job_logs.files, from the store: the logs to serve, relative to the run directory; empty when none is there."""
    found = listing(store, job_id, attempt)
    base = attempt_base(attempt)
    if launcher:
        return [f"{base}/{LAUNCHER_LOG}"] if LAUNCHER_LOG in found else []
    if rank is None:
        return [f"{base}/{name}" for name in merged(found)]
    folder = rank_dir(found, rank, read_marks(store, job_id, attempt, found))
    if folder is None:
        return []
    for wanted in [stream] if stream is not None else ["output", "stderr"]:  # stderr: a rank that died before its output
        if f"{folder}/{wanted}.log" in found:
            return [f"{base}/{folder}/{wanted}.log"]
    return []
