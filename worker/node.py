"""Multi-node jobs on the scheduler's placements (docs/multinode.md).

The scheduler reserves every node of a job in one decision and hands node ``r``'s task to its host. Node 0
is the job's supervisor (worker/supervisor.py): it picks the c10d rendezvous endpoint on its host, writes
it into the job's placement, and starts its torchrun. Every other node runs ``Follower``: it waits for
that endpoint in SQL, starts its own torchrun against it, and stops it when the job stops running this
attempt or node 0 says stop. A follower never writes the job's status; a host that dies under a gang is
found by the reconciler (jobs/lifecycle/reconciler.py), which requeues the job and so fences node 0.
"""

from __future__ import annotations

import logging
import random
import signal
import socket
import time
from pathlib import Path
from types import FrameType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.hosts.registry import read_hosts
from jobs.scheduling.scheduler import task_id
from jobs.settings import Settings
from jobs.store.models import Job, Status
from jobs.sweeps.pauses import trial_pause
from jobspec.spec import SpecError, spec_from_dict
from worker import devices
from worker.executors import make_executor
from worker.executors.base import LaunchError, LaunchRequest
from worker.host import advertised_address
from worker.launch import NodeLaunch, rank_secrets
from worker.sandbox.isolation import follower_identity

log = logging.getLogger(__name__)

ENDPOINT, STOP = "endpoint", "stop"


def free_port(host: str, ports: tuple[int, int], tries: int = 64) -> int:
    """A port of ``ports`` (LOW, HIGH) free on ``host`` now, picked at random; torchrun's store binds it moments later.
    A port the kernel hands out for outgoing connections could be taken in between by any connection on the host
    (it was, at load 14: EADDRINUSE), so the range lies outside those; at random, so that two gangs picking at
    once seldom pick the same one."""
    low, high = ports
    address = host if host != "localhost" else "127.0.0.1"
    picks = random.sample(range(low, high + 1), k=min(tries, high - low + 1))
    for port in picks:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high} on {host} (TORCHYARD_RENDEZVOUS_PORTS): {len(picks)} tried")


def rendezvous_endpoint(settings: Settings) -> str:
    host = advertised_address(settings)
    return f"{host}:{free_port(host, settings.rendezvous_ports)}"


def node_launch(settings: Settings, job_id: str, attempt: int, nnodes: int, rank: int, endpoint: str) -> NodeLaunch:
    return NodeLaunch(nnodes=nnodes, node_rank=rank, endpoint=endpoint, rdzv_id=task_id(job_id, attempt, 0),
                      local_addr=advertised_address(settings), join_timeout_s=settings.gang_join_timeout_s)


def node_gpus(placement: list[dict[str, Any]] | None, rank: int) -> tuple[int, ...] | None:
    """The GPUs the placement gave node ``rank``; None when there is no such node (an engine places the ranks)."""
    for node in placement or []:
        if node.get("node_rank") == rank:
            return tuple(node.get("gpus") or ())
    return None


def say(session: Session, job_id: str, attempt: int, worker_id: str, key: str, value: object) -> bool:
    """Node 0 writes ``key`` into its node of the placement (the endpoint, stop), only while it holds the attempt."""
    row = session.exec(sa.select(Job.placement).where(  # type: ignore[call-overload]
        Job.id == job_id, Job.attempt == attempt, Job.worker_id == worker_id)).first()
    if row is None or not row[0]:
        session.rollback()
        return False
    placement = [dict(n) for n in row[0]]
    placement[0][key] = value
    result = session.exec(sa.update(Job).where(Job.id == job_id, Job.attempt == attempt, Job.worker_id == worker_id)  # type: ignore[call-overload]
                          .values(placement=placement))
    session.commit()
    return result.rowcount == 1


def dead_nodes(session: Session, placement: list[dict[str, Any]] | None, lease_ttl_s: float) -> list[tuple[int, str]]:
    """(node rank, host) of the placement's nodes whose host has not heart-beaten within one lease."""
    alive = {row.host.id for row in read_hosts(session, lease_ttl_s) if row.alive}
    return [(n["node_rank"], n["host"]) for n in placement or [] if n["node_rank"] > 0 and n["host"] not in alive]


class Follower:
    """Node ``rank`` > 0 of one attempt on this host."""

    def __init__(self, job_id: str, attempt: int, rank: int, settings: Settings, session: Session):
        self.job_id, self.attempt, self.rank = job_id, attempt, rank
        self.settings, self.session = settings, session
        self.executor = make_executor(settings)
        self.preempted = False
        self.extra = {"job_id": job_id}

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        self.preempted = True

    def run(self) -> str:
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            return self._run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.session.close()

    def _job(self) -> Job | None:
        try:
            job = self.session.get(Job, self.job_id, populate_existing=True)
            self.session.commit()
        except SQLAlchemyError:
            self.session.rollback()
            raise
        if job is None or job.attempt != self.attempt or job.status not in (Status.RUNNING.value, Status.CANCELLING.value):
            return None
        return job

    def _wait_for_endpoint(self) -> Job | None:
        while not self.preempted:
            try:
                job = self._job()
            except SQLAlchemyError:
                time.sleep(self.settings.poll_interval_s)
                continue
            if job is None or job.status != Status.RUNNING.value:
                return None
            if job.placement and job.placement[0].get(ENDPOINT) and job.run_dir:
                return job
            time.sleep(min(0.2, self.settings.poll_interval_s))
        return None

    def _run(self) -> str:
        job = self._wait_for_endpoint()
        if job is None:
            return "not started: the job no longer runs this attempt"
        gpus = node_gpus(job.placement, self.rank)
        try:
            spec = spec_from_dict(devices.place(job.spec, len(gpus or ()), f"node {self.rank}"))
            secrets = rank_secrets(self.session, job.id, self.settings)
        except (devices.PlacementError, SpecError) as exc:
            log.error("job %s node %d: %s", job.id, self.rank, exc, extra=self.extra)
            return "not started"  # node 0's rendezvous times out without this node and fails the attempt
        node = node_launch(self.settings, job.id, job.attempt, spec.parallel.nnodes, self.rank, job.placement[0][ENDPOINT])  # type: ignore[index]
        try:
            # Node 0's uid: the nodes share the run directory.
            identity = follower_identity(self.settings, self.session, job.id, job.attempt, self.settings.worker_id or "")
        except RuntimeError as exc:
            log.error("job %s node %d: %s", job.id, self.rank, exc, extra=self.extra)
            return "not started"  # node 0's rendezvous times out without this node and fails the attempt
        # Read as node 0 read it: every node's ranks must stop at the same step.
        pause_at = trial_pause(self.session, job.id, job.labels, spec.kind)
        request = LaunchRequest(job_id=job.id, attempt=job.attempt, run_dir=Path(job.run_dir or ""), spec=spec,
                                resume_from=job.resume_from, node=node, secrets=secrets, gpus=gpus, identity=identity,
                                owner=job.owner, pause_at=pause_at)
        try:
            launch = self.executor.start(request)
        except LaunchError as exc:
            log.error("job %s node %d: could not start (%s)", job.id, self.rank, exc, extra=self.extra)
            return "not started"
        log.info("job %s node %d: torchrun joins %s", job.id, self.rank, node.endpoint, extra=self.extra)
        while not (state := self.executor.poll(launch)).ended:
            reason = self._why_stop()
            if reason:
                log.warning("job %s node %d: stopping (%s)", self.job_id, self.rank, reason, extra=self.extra)
                state = self.executor.stop(launch, self.settings.stop_grace_s)
                break
            time.sleep(self.settings.poll_interval_s)
        self.executor.release(launch)
        log.info("job %s node %d: torchrun exited %s", self.job_id, self.rank, state.exit_code, extra=self.extra)
        return f"node {self.rank} exited {state.exit_code}"

    def _why_stop(self) -> str | None:
        if self.preempted:
            return "worker is stopping"
        try:
            job = self._job()
        except SQLAlchemyError:
            return None  # node 0 and the reconciler decide; a database blip is not a reason to stop
        if job is None:
            return "the job no longer runs this attempt"
        if job.status == Status.CANCELLING.value:
            return "cancelled"
        if job.placement and job.placement[0].get(STOP):
            return "node 0 stopped the gang"
        return None
