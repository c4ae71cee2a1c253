"""Ending what earlier attempts left running, on a worker that runs jobs as its own user.

A worker with a uid range ends a dead attempt's processes by uid (worker/sandbox/isolation.py). One without (jobs run as
the worker's own user: TORCHYARD_SINGLE_USER, or the local stack as a non-root user) cannot; it finds them by the
marks every process of an attempt carries in its environment (``TORCHYARD_JOB_ID``, ``TORCHYARD_ATTEMPT``,
``TORCHYARD_RUN_DIR``; worker/launch.py). A rank that started while its torchrun died, or a process a script
detached, can outlive its attempt; so at its start, and every lease period after, such a worker ends every process
of its own user whose marks name an attempt that no live lease holds, under this deployment's runs directory.

Nothing else: a process without both marks is not a job's; a process whose run directory is elsewhere belongs to
another deployment sharing the user (another stack, another test); an attempt still held under a live lease is
kept, whoever holds it: when only a worker's own process died, its forked supervisors still run their jobs; and an
attempt an engine runs (a Slurm job: its attempt row names it) is the engine's to stop. Its ranks run under slurmd,
not under a worker, and the next attempt stops them through the engine with SIGTERM and the grace to checkpoint
(worker/executor_attempts.py); a SIGKILL from here would race that stop and lose every step since the last checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath

import psutil
import sqlalchemy as sa
from sqlmodel import Session

from jobs.infra.clock import db_now
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Attempt, Job, Status
from worker.launch import RUN_DIR_ENV
from worker.sandbox.processes import ATTEMPT_MARK, JOB_MARK

log = logging.getLogger(__name__)

_LIVE = (Status.RUNNING.value, Status.CANCELLING.value)


@dataclass(frozen=True)
class Marked:
    """A process as the sweep sees it: its uid and the marks of its environment (None where absent)."""

    pid: int
    uid: int
    job_id: str | None
    attempt: str | None
    run_dir: str | None


def to_end(procs: Iterable[Marked], held: set[tuple[str, int]], uid: int, runs_dir: str, spare: set[int]) -> list[int]:
    """The pids to end: processes of ``uid`` marked with a job and an attempt, whose run directory lies under
    ``runs_dir`` (resolved), whose attempt is not in ``held``, and that are not in ``spare`` (this process)."""
    top = PurePath(runs_dir)
    held_marks = {(job, str(attempt)) for job, attempt in held}
    found = []
    for p in procs:
        if p.uid != uid or p.pid in spare or not p.job_id or not p.attempt or not p.run_dir:
            continue
        run_dir = PurePath(p.run_dir)
        if top not in run_dir.parents:
            continue
        if (p.job_id, p.attempt) not in held_marks:
            found.append(p.pid)
    return sorted(found)


def _marks(environ: bytes) -> tuple[str | None, str | None, str | None]:
    values: dict[str, str] = {}
    for item in environ.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name in (JOB_MARK.encode(), ATTEMPT_MARK.encode(), RUN_DIR_ENV.encode()):
            values[name.decode()] = value.decode(errors="replace")
    return values.get(JOB_MARK), values.get(ATTEMPT_MARK), values.get(RUN_DIR_ENV)


def scan(uid: int) -> dict[Marked, psutil.Process]:
    """Every process of ``uid`` whose environment carries a job mark, with its marks; the psutil handle kills
    this process and not one that took its pid since."""
    found = {}
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is None or uids.real != uid:
            continue
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                job_id, attempt, run_dir = _marks(f.read())
        except OSError:
            continue
        if job_id is not None:
            found[Marked(proc.pid, uid, job_id, attempt, run_dir)] = proc
    return found


def held_attempts(session: Session) -> set[tuple[str, int]]:
    """The (job, attempt) pairs a live lease holds now, by the database's clock."""
    rows = session.exec(sa.select(Job.id, Job.attempt).where(  # type: ignore[call-overload]
        Job.status.in_(_LIVE), Job.lease_expires_at >= db_now(session))).all()  # type: ignore[attr-defined]
    session.commit()
    return {(job_id, attempt) for job_id, attempt in rows}


def engine_run(session: Session, job_ids: Iterable[str]) -> set[tuple[str, int]]:
    """The attempts of ``job_ids`` an executor's engine runs (their attempt row holds its id, a Slurm job's)."""
    rows = session.exec(sa.select(Attempt.job_id, Attempt.attempt).where(  # type: ignore[call-overload]
        Attempt.job_id.in_(sorted(set(job_ids))), Attempt.executor_id.is_not(None))).all()  # type: ignore[attr-defined,union-attr]
    session.commit()
    return {(job_id, attempt) for job_id, attempt in rows}


def end_leftovers(session: Session, settings: Settings) -> list[int]:
    """End this user's processes of attempts no live lease holds and no engine runs; the pids ended."""
    uid = os.getuid()
    procs = scan(uid)
    if not procs:
        return []
    # Read after the scan: an attempt claimed before its processes started is seen held.
    held = held_attempts(session) | engine_run(session, (p.job_id for p in procs if p.job_id))
    pids = to_end(procs, held, uid, os.path.realpath(settings.runs_dir), {os.getpid()})
    by_pid = {p.pid: (p, proc) for p, proc in procs.items()}
    for pid in pids:
        p, proc = by_pid[pid]
        log.warning("job %s attempt %s: process %d outlived its attempt; killing it", p.job_id, p.attempt, pid,
                    extra={"job_id": p.job_id})
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return pids


class LeftoverSweep(threading.Thread):
    """Ends leftovers at once, then every ``interval_s``: a lease held when the worker started (by a supervisor that
    died with it) lapses later, and what ran under it must end then."""

    def __init__(self, settings: Settings, interval_s: float):
        super().__init__(name="torchyard-leftovers", daemon=True)
        self.settings, self.interval_s = settings, interval_s
        self.stopped = threading.Event()

    def step(self) -> list[int]:
        try:
            with Session(get_engine(self.settings.database_url), expire_on_commit=False) as session:
                return end_leftovers(session, self.settings)
        except Exception:  # noqa: BLE001 - the loop must outlive a passing database outage
            log.exception("leftover sweep failed")
            return []

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.step()
