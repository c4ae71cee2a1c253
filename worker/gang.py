"""Gang scheduling of multi-node jobs on Redis (docs/multinode.md).

RQ hands one task to one worker. A job with ``parallel.nnodes = N > 1`` still has one task; the
worker that takes it becomes node 0, the gang's leader (worker/supervisor.py). The leader:

1. takes the cluster-wide lock ``jobs.gang.ASSEMBLING_LOCK`` (SET NX PX). Held by another gang:
   it re-offers its job at the end of the queue and lets its worker go, so no worker is ever held
   by a gang that is not the one assembling;
2. enqueues N-1 ``follow`` tasks at the FRONT of the job's queue and waits up to
   ``gang_assemble_timeout_s`` for N-1 workers to join the round (Redis hash + heartbeat keys);
3. all joined: claims the job (queued -> running), publishes ``go`` with the rendezvous endpoint
   (its host, a free port), releases the lock; every node starts torchrun with c10d rendezvous.
   Not all joined: publishes ``abort`` (the joined followers return and free their workers),
   removes the follow tasks still queued, releases the lock and re-offers the job.

While running, the leader owns the job row, ingestion and checkpoints; each follower supervises its
own torchrun, heart-beats in Redis and reports its exit code. Any node's end that is not a clean
finish stops the whole gang (``stop``).
"""

from __future__ import annotations

import logging
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TypeVar

import sqlalchemy as sa
from redis import Redis
from sqlmodel import Session

from jobs import gang as keys
from jobs import queue, retry
from jobs.db import get_engine
from jobs.models import Job, Status
from jobs.settings import Settings, get_settings
from trainer.exit_codes import PREEMPTED_EXIT_CODE
from trainer.spec import SpecError, spec_from_dict
from worker import devices, processes
from worker.isolation import follower_identity
from worker.job_users import JobIdentity
from worker.launch import NodeLaunch, rank_secrets, torchrun_command, torchrun_env

log = logging.getLogger(__name__)

T = TypeVar("T")

ASSEMBLING, GO, ABORT, STOP = "assembling", "go", "abort", "stop"

# Compare-and-act on the lock: only the round that holds it may refresh or release it.
_REFRESH = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def advertised_host(settings: Settings) -> str:
    if settings.worker_host:
        return settings.worker_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port(host: str) -> int:
    """A port free on ``host`` now; torchrun's store binds it moments later (a small, accepted race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host != "localhost" else "127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Retried:
    """A Redis client whose every command rides out a blip (a restart, a failover) for up to ``deadline_s``:
    shorter than a heartbeat's expiry, so a peer never looks lost because of it."""

    def __init__(self, redis: Redis, deadline_s: float):
        self._redis, self._deadline_s = redis, deadline_s

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._redis, name)
        if not callable(attr) or name == "pipeline":
            return attr

        def call(*args: object, **kwargs: object) -> object:
            return retry.call(lambda: attr(*args, **kwargs), deadline=self._deadline_s, what=f"gang redis {name}")

        return call

    def pipeline(self) -> _RetriedPipeline:
        return _RetriedPipeline(self._redis, self._deadline_s)


class _RetriedPipeline:
    """Queues commands and sends them with retries; the gang's pipelines are idempotent (HSET, EXPIRE, DEL)."""

    def __init__(self, redis: Redis, deadline_s: float):
        self._redis, self._deadline_s = redis, deadline_s
        self._commands: list[tuple[str, tuple[object, ...], dict[str, object]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        def queue_command(*args: object, **kwargs: object) -> None:
            self._commands.append((name, args, kwargs))

        return queue_command

    def execute(self) -> list[object]:
        def send() -> list[object]:
            pipe = self._redis.pipeline()
            for name, args, kwargs in self._commands:
                getattr(pipe, name)(*args, **kwargs)
            return pipe.execute()

        return retry.call(send, deadline=self._deadline_s, what="gang redis pipeline")


class Round:
    """The Redis state of one assembly round of one attempt's gang."""

    def __init__(self, redis: Redis, job_id: str, attempt: int, nonce: str, nnodes: int, hb_ttl_s: float):
        self.hb_ttl_ms = max(1000, int(hb_ttl_s * 1000))
        self.redis = _Retried(redis, self.hb_ttl_ms / 2000)  # type: ignore[assignment]
        self.job_id, self.attempt, self.nonce, self.nnodes = job_id, attempt, nonce, nnodes
        self.key = keys.round_key(job_id, attempt, nonce)
        self._missing: dict[int, float] = {}

    def lost(self, rank: int) -> bool:
        """``rank``'s heartbeat has been missing for a whole heartbeat TTL. One missing read is not enough:
        Redis restarted empty (or flushed) drops every heartbeat key until the next beat."""
        if self.alive(rank):
            self._missing.pop(rank, None)
            return False
        since = self._missing.setdefault(rank, time.monotonic())
        return time.monotonic() - since > self.hb_ttl_ms / 1000

    # The round's control hash: state (assembling | go | abort | stop), endpoint, nnodes.
    def open(self) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(self.key, mapping={"state": ASSEMBLING, "nnodes": self.nnodes})
        pipe.expire(self.key, keys.KEY_TTL_S)
        pipe.execute()

    def state(self) -> tuple[str | None, str | None]:
        state, endpoint = self.redis.hmget(self.key, ["state", "endpoint"])
        return (state.decode() if state else None), (endpoint.decode() if endpoint else None)

    def publish(self, state: str, endpoint: str | None = None) -> None:
        mapping = {"state": state, **({"endpoint": endpoint} if endpoint else {})}
        self.redis.hset(self.key, mapping=mapping)

    def join(self, rank: int, worker: str) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(f"{self.key}:members", str(rank), worker)
        pipe.expire(f"{self.key}:members", keys.KEY_TTL_S)
        pipe.execute()
        self.beat(rank)

    def members(self) -> dict[int, str]:
        return {int(k): v.decode() for k, v in self.redis.hgetall(f"{self.key}:members").items()}

    def beat(self, rank: int) -> None:
        self.redis.set(f"{self.key}:hb:{rank}", "1", px=self.hb_ttl_ms)

    def alive(self, rank: int) -> bool:
        return bool(self.redis.exists(f"{self.key}:hb:{rank}"))

    def report_exit(self, rank: int, code: int | None) -> None:
        pipe = self.redis.pipeline()
        pipe.hset(f"{self.key}:exits", str(rank), "" if code is None else str(code))
        pipe.expire(f"{self.key}:exits", keys.KEY_TTL_S)
        pipe.delete(f"{self.key}:hb:{rank}")
        pipe.execute()

    def exits(self) -> dict[int, int | None]:
        return {int(k): (int(v) if v else None) for k, v in self.redis.hgetall(f"{self.key}:exits").items()}


class Leader:
    """Node 0's side of the protocol, driven by the supervisor."""

    def __init__(self, redis: Redis, settings: Settings, job: Job, nnodes: int, worker: str):
        self.raw_redis = redis  # RQ's queues take the plain client
        self.redis = _Retried(redis, max(1.0, settings.lease_ttl_s / 2))  # type: ignore[assignment]
        self.settings, self.job, self.worker = settings, job, worker
        self.nonce = secrets.token_hex(4)
        self.round = Round(redis, job.id, job.attempt, self.nonce, nnodes, settings.lease_ttl_s)
        self.lock_value = keys.lock_value(job.id, job.attempt, self.nonce)
        self.lock_ms = int(settings.gang_assemble_timeout_s * 2000)
        self.follower_tasks: list[str] = []
        self.nnodes = nnodes

    def _rq(self, fn: Callable[[], T]) -> T:
        return retry.call(fn, deadline=max(1.0, self.settings.lease_ttl_s / 2), what=f"job {self.job.id}: gang queue")

    @property
    def followers(self) -> range:
        return range(1, self.nnodes)

    def lock(self) -> bool:
        return bool(self.redis.set(keys.ASSEMBLING_LOCK, self.lock_value, nx=True, px=self.lock_ms))

    def lock_holder(self) -> str | None:
        value = self.redis.get(keys.ASSEMBLING_LOCK)
        return value.decode() if value else None

    def release(self) -> None:
        self.redis.eval(_RELEASE, 1, keys.ASSEMBLING_LOCK, self.lock_value)

    def assemble(self, still_wanted: Callable[[], bool]) -> bool:
        """Recruit the followers; True when all joined in time (the lock is still held), else the
        round is aborted, its tasks withdrawn and the lock released. ``still_wanted()`` is False when
        the job was cancelled or this worker is stopping meanwhile."""
        self.round.open()
        self.round.join(0, self.worker)
        self.follower_tasks = [self._rq(lambda r=r: queue.enqueue_follower(self.raw_redis, self.job, self.nonce, r))
                               for r in self.followers]
        deadline = time.monotonic() + self.settings.gang_assemble_timeout_s
        while time.monotonic() < deadline and still_wanted():
            self.redis.eval(_REFRESH, 1, keys.ASSEMBLING_LOCK, self.lock_value, self.lock_ms)
            self.round.beat(0)
            joined = self.round.members()
            if all(r in joined for r in self.followers):
                log.info("job %s: gang of %d assembled: %s", self.job.id, self.nnodes, joined, extra={"job_id": self.job.id})
                return True
            time.sleep(min(0.2, self.settings.poll_interval_s))
        self.abort()
        return False

    def abort(self) -> None:
        self.round.publish(ABORT)
        self._rq(lambda: queue.remove(self.raw_redis, self.job.queue, self.follower_tasks))
        self.release()

    def go(self, endpoint: str) -> None:
        self.round.publish(GO, endpoint)
        self.release()

    def stop(self) -> None:
        self.round.publish(STOP)

    def trouble(self) -> tuple[str, str] | None:
        """(what, kind) when a follower ended other than cleanly while node 0 runs; kind is ``lost`` (its
        heartbeat expired without an exit report), ``preempted`` (its worker was stopped and the trainer
        checkpointed) or ``failed``."""
        exits = self.round.exits()
        members = self.round.members()
        for rank in self.followers:
            who = f"node {rank} (worker {members.get(rank)})"
            if rank in exits:
                if exits[rank] == PREEMPTED_EXIT_CODE:
                    return f"{who} was preempted", "preempted"
                if exits[rank] != 0:
                    return f"{who} exited with code {exits[rank]}", "failed"
            elif self.round.lost(rank):
                return f"{who} stopped heart-beating", "lost"
        return None

    def settle(self, timeout_s: float, on_wait: Callable[[], None] | None = None) -> list[int]:
        """Wait until every follower reported its exit or stopped heart-beating; the ranks lost (no exit report)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.round.beat(0)
            exits = self.round.exits()
            pending = [r for r in self.followers if r not in exits and self.round.alive(r)]
            if not pending or time.monotonic() > deadline:
                if pending:
                    log.warning("job %s: nodes %s did not report their exit", self.job.id, pending, extra={"job_id": self.job.id})
                return [r for r in self.followers if r not in exits]
            if on_wait:
                on_wait()
            time.sleep(0.2)


def node_launch(settings: Settings, job_id: str, attempt: int, nnodes: int, rank: int, endpoint: str) -> NodeLaunch:
    return NodeLaunch(nnodes=nnodes, node_rank=rank, endpoint=endpoint, rdzv_id=queue.rq_job_id(job_id, attempt),
                      local_addr=advertised_host(settings), join_timeout_s=settings.gang_join_timeout_s)


# ---------------------------------------------------------------- followers


def follow(job_id: str, attempt: int, nonce: str, node_rank: int) -> str:
    """RQ job function of node ``node_rank`` > 0: join the round, wait for go, run torchrun, report its exit."""
    settings = get_settings()
    engine = get_engine(settings.database_url)
    engine.dispose(close=False)  # forked work horse: do not share the parent's connections
    return Follower(job_id, attempt, nonce, node_rank, settings, Session(engine), queue.redis_client(settings.redis_url)).run()


class Follower:
    def __init__(self, job_id: str, attempt: int, nonce: str, rank: int, settings: Settings, session: Session, redis: Redis):
        self.job_id, self.attempt, self.rank, self.settings, self.session = job_id, attempt, rank, settings, session
        self.round = Round(redis, job_id, attempt, nonce, 0, settings.lease_ttl_s)
        self.worker = settings.worker_id or f"{socket.gethostname()}"
        self.preempted = False
        self.extra = {"job_id": job_id}
        self.identity: JobIdentity | None = None

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        self.preempted = True

    def run(self) -> str:
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            return self._run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.session.close()

    def _run(self) -> str:
        state, _ = self.round.state()
        if state != ASSEMBLING:
            return f"gang round is {state or 'gone'}"
        self.round.join(self.rank, self.worker)
        endpoint = self._wait_for_go()
        if endpoint is None:
            self.round.report_exit(self.rank, None)
            return "gang did not start"
        code = self._launch(endpoint)
        self.round.report_exit(self.rank, code)
        log.info("job %s node %d: torchrun exited %s", self.job_id, self.rank, code, extra=self.extra)
        return f"node {self.rank} exited {code}"

    def _wait_for_go(self) -> str | None:
        while not self.preempted:
            self.round.beat(self.rank)
            state, endpoint = self.round.state()
            if state == GO and endpoint:
                return endpoint
            if state != ASSEMBLING or not self.round.alive(0):
                return None  # aborted, or the leader vanished while assembling
            time.sleep(min(0.2, self.settings.poll_interval_s))
        return None

    def _job(self) -> Job | None:
        job = self.session.get(Job, self.job_id, populate_existing=True)
        self.session.commit()
        return job

    def _launch(self, endpoint: str) -> int | None:
        job = self._job()
        if job is None or job.attempt != self.attempt or job.status != Status.RUNNING.value:
            return None
        try:
            spec = spec_from_dict(devices.place(job.spec, devices.gpu_count(self.settings), f"node {self.rank}"))
        except devices.PlacementError as exc:
            log.error("job %s node %d: %s", job.id, self.rank, exc, extra=self.extra)
            return None  # node 0's rendezvous times out without this node and fails the attempt
        run_dir = Path(job.run_dir or "")
        node = node_launch(self.settings, job.id, job.attempt, spec.parallel.nnodes, self.rank, endpoint)
        try:
            command = torchrun_command(spec, run_dir, job.attempt, self.settings, node=node)
            secrets = rank_secrets(self.session, job.id, self.settings)
        except SpecError:
            return None  # node 0 fails the job with the same error
        env = torchrun_env(job.id, job.attempt, run_dir, self.settings, spec, resume_from=job.resume_from, node=node,
                           secrets=secrets)
        log_path = run_dir / "logs" / f"attempt-{job.attempt}" / f"launcher-node-{self.rank}.log"
        try:
            # Node 0's uid: the nodes share the run directory.
            self.identity = follower_identity(self.settings, self.session, job.id, job.attempt, self.worker)
        except RuntimeError as exc:
            log.error("job %s node %d: %s", job.id, self.rank, exc, extra=self.extra)
            return None  # node 0's rendezvous times out without this node and fails the attempt
        if self.identity is not None:
            env["HOME"] = str(run_dir.resolve())
        proc = processes.spawn(command, env, cwd=run_dir, log_path=log_path, identity=self.identity)
        log.info("job %s node %d: torchrun pid %d joins %s", job.id, self.rank, proc.pid, endpoint, extra=self.extra)
        return self._watch(proc)

    def _watch(self, proc: subprocess.Popen[bytes]) -> int | None:
        while proc.poll() is None:
            self.round.beat(self.rank)
            reason = self._why_stop()
            if reason:
                log.warning("job %s node %d: stopping (%s)", self.job_id, self.rank, reason, extra=self.extra)
                return processes.stop(proc, self.job_id, self.settings.stop_grace_s,
                                      on_wait=lambda: self.round.beat(self.rank), node=self.rank, attempt=self.attempt,
                                      identity=self.identity)
            time.sleep(self.settings.poll_interval_s)
        processes.kill_attempt(self.job_id, self.identity, node=self.rank, attempt=self.attempt)
        return proc.returncode

    def _why_stop(self) -> str | None:
        """A follower never writes the job's status; it stops when the gang or the record says so."""
        if self.preempted:
            return "worker is stopping"
        state, _ = self.round.state()
        if state == STOP:
            return "the leader stopped the gang"
        if self.round.lost(0):
            return "the leader stopped heart-beating"
        try:
            job = self._job()
        except sa.exc.SQLAlchemyError:
            self.session.rollback()
            return None  # the leader's heartbeat still says the gang is wanted
        if job is None or job.attempt != self.attempt or job.status not in (Status.RUNNING.value, Status.CANCELLING.value):
            return "the job is no longer running this attempt"
        return None
