"""What the supervisor does for a job uid: at the start of an attempt lease a uid, end whatever still runs
as it here, give the attempt a cgroup and the run directory; at its end kill everything of it and give the
uid back. A worker that runs jobs as its own user instead binds itself to the first owner it runs."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import psutil
from redis import Redis
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.settings import Settings
from worker.sandbox import cgroups, processes, run_dirs, uid_leases
from worker.sandbox.job_users import JobIdentity, Mode, end_uid, isolation_mode, owner_problem

log = logging.getLogger(__name__)

OWNER_KEY = "torchyard:worker-owner:{worker}"


class Isolation:
    def __init__(self, settings: Settings, worker_id: str):
        self.settings, self.worker_id = settings, worker_id
        self.mode: Mode = isolation_mode(settings)

    def owner_refused(self, redis: Redis, owner: str) -> str | None:
        """Why this worker refuses the owner's job (it runs jobs as its own user and already ran another owner's)."""
        if not self.mode.one_owner:
            return None
        key = OWNER_KEY.format(worker=self.worker_id)
        redis.set(key, owner, nx=True)
        bound = redis.get(key)
        return owner_problem(bound.decode() if isinstance(bound, bytes) else bound, owner)

    def take(self, session: Session, job_id: str, attempt: int, run_dir: Path) -> JobIdentity | None:
        """The uid and cgroup the attempt runs as, the run directory handed to it; None: the worker's own user."""
        if self.mode.uids is None:
            return None
        uid = uid_leases.acquire(session, self.mode.uids, job_id, attempt, self.worker_id)
        took = end_uid(uid)  # a process a crashed worker left under this uid must not see the next job
        if took > 0.5:
            log.warning("job %s: processes of uid %d were still running here; killed in %.2fs", job_id, uid, took)
        identity = JobIdentity(uid, cgroups.create(self.worker_id, job_id, attempt), run_dir)
        run_dirs.hand_over(run_dir, uid, self.mode.uids)
        log.info("job %s attempt %d runs as uid %d%s", job_id, attempt, uid,
                 f" in cgroup {identity.cgroup}" if identity.cgroup else "", extra={"job_id": job_id})
        return identity

    def end(self, session: Session, job_id: str, attempt: int, identity: JobIdentity) -> None:
        """Nothing of the attempt outlives it: its cgroup and uid emptied, then the uid leased again."""
        took = processes.end_identity(identity)
        log.info("job %s attempt %d: no process of uid %d left after %.3fs", job_id, attempt, identity.uid, took,
                 extra={"job_id": job_id})
        try:
            uid_leases.release(session, identity.uid, job_id, attempt)
        except SQLAlchemyError as exc:
            # The row goes stale once the job leaves this attempt; another worker takes it over then.
            log.warning("job %s: could not give uid %d back (%s)", job_id, identity.uid, exc.__class__.__name__)
            with contextlib.suppress(SQLAlchemyError):
                session.rollback()


def follower_identity(settings: Settings, session: Session, job_id: str, attempt: int, worker_id: str) -> JobIdentity | None:
    """Another node of a multi-node job runs as the uid its node 0 leased (they share the run directory)."""
    mode = isolation_mode(settings)
    if mode.uids is None:
        return None
    uid = uid_leases.held(session, job_id, attempt)
    if uid is None:
        raise RuntimeError(f"job {job_id} attempt {attempt} holds no uid")
    return JobIdentity(uid, cgroups.create(worker_id, job_id, attempt))


def on_worker_start(settings: Settings, session: Session, worker_id: str) -> Mode:
    """Say how this worker runs jobs; in uid mode secure the service's directories and end what a crashed
    worker left on this host under uids no other worker's live attempt holds."""
    mode = isolation_mode(settings)
    log.info("job isolation: %s", mode.description)
    if mode.uids is None:
        return mode
    run_dirs.secure_service_dirs(settings)
    low, high = mode.uids
    running = {p.info["uids"].real for p in _range_processes(low, high)}
    # Read after the scan: a uid leased before its processes started is seen held.
    leftovers = running - uid_leases.foreign_uids(session, mode.uids, worker_id)
    for uid in sorted(leftovers):
        log.warning("uid %d of the job range still runs processes here with no live attempt; killing them", uid)
        end_uid(uid)
    return mode


def _range_processes(low: int, high: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and low <= uids.real <= high:
            found.append(proc)
    return found

