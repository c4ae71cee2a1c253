"""The RQ job function: supervise one attempt of one job, from claim to final status.

start: CAS queued -> running (exactly one supervisor wins), write spec.json, spawn torchrun.
loop:  tail events.jsonl into SQL, heartbeat the lease, watch for cancel, timeout, stalls
       and preemption (SIGTERM forwarded by the worker process).
exit:  read the error file, then succeeded | failed | cancelled | queued (retry or preemption).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

import sqlalchemy as sa
from redis import Redis
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs import queue, retry
from jobs.clock import db_now
from jobs.db import get_engine
from jobs.ingest import Fenced, ingest_events
from jobs.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.reconciler import worker_losses
from jobs.settings import Settings, get_settings
from jobs.states import TransitionRefused, transition
from trainer import pg_watch
from trainer.pdeathsig import set_not_dumpable
from trainer.spec import AnySpec, SpecError, spec_from_dict
from worker import devices, job_code, mlflow_runs, oom, outcome, run_dirs
from worker import node as nodes
from worker.executors import make_executor
from worker.executors.base import Launch, LaunchError, LaunchRequest, Phase, RankState, engine_verdict
from worker.found import Found, found_in_run, resume_arguments
from worker.isolation import Isolation
from worker.job_users import JobIdentity
from worker.launch import ERROR_FILE, SPEC_FILE, NodeLaunch, rank_secrets
from worker.tail import EventTail
from worker.uid_leases import NoFreeUid

log = logging.getLogger(__name__)

T = TypeVar("T")


def worker_id(settings: Settings) -> str:
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"


def supervise(job_id: str, attempt: int) -> str:
    """Node 0 of one attempt the scheduler placed on this host: adopt it, run it, give its verdict."""
    settings = get_settings()
    set_not_dumpable()  # the work horse holds the service's settings; its jobs run as the same user
    engine = get_engine(settings.database_url)
    # Each task is a forked child of the worker (worker/host_runner.py): inherited connections must not be shared.
    engine.dispose(close=False)
    return Supervisor(job_id, attempt, settings, engine, queue.redis_client(settings.redis_url)).run()


def run_node(job_id: str, attempt: int, node_rank: int) -> str:
    """One node task of a placement (jobs.scheduler.NODE_TASK): node 0 supervises the job, any other follows it."""
    if node_rank == 0:
        return supervise(job_id, attempt)
    settings = get_settings()
    set_not_dumpable()
    engine = get_engine(settings.database_url)
    engine.dispose(close=False)  # a forked task: the parent's connections are not its own
    return nodes.Follower(job_id, attempt, node_rank, settings, Session(engine, expire_on_commit=False)).run()


@dataclass
class _Watch:
    """Clocks of one attempt (monotonic seconds)."""

    last_heartbeat_ok: float
    # Armed when the executor first reports the ranks running: an attempt waiting in an engine's queue
    # (a pending Slurm job) has not started its timeout_s.
    started: float | None = None
    # Armed by the first event: start-up (imports, rendezvous, data) is bounded by timeout_s instead.
    last_progress: float | None = None
    next_heartbeat: float = 0.0


class Supervisor:
    def __init__(self, job_id: str, attempt: int, settings: Settings, engine: Engine, redis: Redis):
        self.job_id, self.rq_attempt = job_id, attempt
        self.settings, self.engine, self.redis = settings, engine, redis
        self.worker_id = worker_id(settings)
        self.session = Session(engine, expire_on_commit=False)
        self.log_extra = {"job_id": job_id}
        self.last_phase: str | None = None
        self.preempt_requested = False
        # Set by the scheduler (jobs/stops.py) when this job must make room: checkpoint, then back in line.
        self.stop_request: str | None = None
        # The scheduler's placement of the adopted attempt; nnodes > 1: this supervisor is node 0 of a gang.
        self.placement: list[dict[str, object]] | None = None
        self.nnodes = 1
        self._setup_beat = 0.0  # next heartbeat while the job's environment is built
        # When the lease was last renewed (monotonic); database calls retry until 0.8 TTL past it.
        self.lease_ok = time.monotonic()
        self.lease_lost = False
        self.watchdog_fired = False  # the ranks were stopped because the lease went unrenewed
        self.attempt: int | None = None  # the claimed attempt, a plain value: ORM rows expire on rollback
        # Where the ranks run (worker/executors/): this class never learns which one.
        self.executor = make_executor(settings)
        self.launch: Launch | None = None
        self.isolation = Isolation(settings, self.worker_id)
        self.identity: JobIdentity | None = None  # the attempt's uid and cgroup, once leased

    # ------------------------------------------------------------ lifecycle

    def run(self) -> str:
        # The worker process forwards SIGTERM (docker stop, node drain) to this task.
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            try:
                job = self._claim()
            except TransitionRefused as exc:
                log.info("job %s: not started (%s)", self.job_id, exc, extra=self.log_extra)
                return f"skipped: {exc}"
            try:
                return self._run_attempt(job)
            except Fenced as exc:
                log.warning("%s; stopping this attempt's processes", exc, extra=self.log_extra)
                self._kill_own()
                return "lost ownership"
            except SQLAlchemyError as exc:
                # Unreachable past our lease: the reconciler requeues the job; no process of ours may run on.
                log.error("job %s: database unreachable past the lease (%s); giving the attempt up", self.job_id,
                          exc.__class__.__name__, extra=self.log_extra)
                self._gang_stop_quietly()
                self._kill_own()
                return "lost ownership (database unreachable)"
        finally:
            self._stop_watchdog()
            self._end_identity()
            signal.signal(signal.SIGTERM, previous)
            self.session.close()

    # ------------------------------------------------------------ gang (multi-node jobs, worker/node.py)

    def _gang_stop(self) -> None:
        """Tell the other nodes to stop their ranks now (a checkpoint on SIGTERM is a collective of every node)."""
        if self.nnodes > 1 and self.attempt is not None:
            nodes.say(self.session, self.job_id, self.attempt, self.worker_id, nodes.STOP, True)

    def _gang_stop_quietly(self) -> None:
        try:
            self._gang_stop()
        except Exception:  # noqa: BLE001 - giving up anyway; the followers stop once the job leaves this attempt
            log.warning("job %s: could not tell the gang to stop", self.job_id, extra=self.log_extra)

    def _gang_lost(self) -> list[tuple[int, str]]:
        """After node 0's ranks failed: the nodes whose host died, waited for up to a lease (a host is dead once its
        heartbeat is a lease old), so a peer's crash is told apart from a training error. Heartbeats meanwhile."""
        if self.nnodes <= 1:
            return []
        deadline = time.monotonic() + self.settings.lease_ttl_s * 1.2
        while True:
            with contextlib.suppress(SQLAlchemyError):
                dead = nodes.dead_nodes(self.session, self.placement, self.settings.lease_ttl_s)  # type: ignore[arg-type]
                if dead:
                    return dead
            if time.monotonic() >= deadline or self.lease_lost:
                return []
            self._try_heartbeat()
            time.sleep(0.5)

    def _gang_failure(self, run_dir: Path, attempt: int) -> outcome.Failure | None:
        """The first other node whose ranks left an error with a traceback, as its own error file tells it."""
        for rank in range(1, self.nnodes):
            found = outcome.failure(1, run_dir / f"error-node-{rank}.json",
                                    run_dir / "logs" / f"attempt-{attempt}" / f"launcher-node-{rank}.log")
            if found.traceback is not None:
                return outcome.Failure(found.type, f"node {rank}: {found.message}", found.traceback, None, found.log_tail, found.rank)
        return None

    def _done_despite(self, job: Job, what: str) -> str:
        """Training finished: the trainer's "done" comes after the last step and the final checkpoint, both
        collective, so every rank got there. A rank that crashes after that, while tearing down (seen on
        CPU: a gloo rank aborting at interpreter exit once its peers on another node are gone), loses nothing."""
        log.warning("job %s: %s after training finished; the job succeeded", job.id, what, extra=self.log_extra)
        return self._finish(job, Status.SUCCEEDED, reason=f"training done; {what} while shutting down",
                            outcome="succeeded", exit_code=0)

    def _node_lost(self, job: Job, what: str, code: int | None) -> str:
        """A follower's worker vanished: like a lost worker, requeued without spending a retry, up to max_worker_losses."""
        error = outcome.Failure(ErrorType.WORKER_LOST, what, None, code)
        if self._db(lambda: worker_losses(self.session, job.id), "counting lost workers") < self.settings.max_worker_losses:
            return self._requeue(job, reason=f"{what}; requeued", outcome_name="lost", consume_retry=False,
                                 exit_code=code, error=error)
        return self._fail_or_retry(job, outcome.Failure(
            ErrorType.WORKER_LOST, f"{what}; {self.settings.max_worker_losses} workers lost already", None, code), retry=False)

    def _disk_full(self, job: Job, exc: OSError, run_dir: Path) -> str:
        """No space to prepare the run: named as such (not a lost worker), and not retried: another attempt would
        write to the same volume."""
        self._gang_stop_quietly()
        where = exc.filename or getattr(exc, "path", None) or run_dir
        message = f"disk full: no space left on the device writing {where}"
        log.error("job %s: %s", self.job_id, message, extra=self.log_extra)
        return self._fail_or_retry(job, outcome.Failure(ErrorType.DISK_FULL, message, None, None), retry=False)

    def _bad_event(self, job: Job, code: int | None) -> str:
        """The trainer wrote an event the service cannot store: the same code would write it again, so no retry."""
        bad = self.tail.bad
        log.error("job %s: malformed event (%s); failing the job", self.job_id, bad, extra=self.log_extra)
        return self._fail_or_retry(job, outcome.Failure(ErrorType.BAD_EVENT, f"malformed event: {bad}", None, code), retry=False)

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        log.warning("job %s: worker is stopping; preempting the attempt", self.job_id, extra=self.log_extra)
        self.preempt_requested = True

    def _claim(self) -> Job:
        """Adopt the attempt the scheduler placed here: exactly one task does (the attempt's row names no worker until
        then), and only while the job runs this attempt on this host. Raises TransitionRefused otherwise."""
        def claim() -> Job:
            run_dir = (self.settings.runs_dir / self.job_id).resolve()
            placed_here = sa.exists().where(Job.id == self.job_id, Job.attempt == self.rq_attempt, Job.worker_id == self.worker_id,
                                            Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]))  # type: ignore[attr-defined]
            adopted = self.session.exec(  # type: ignore[call-overload]
                sa.update(Attempt).where(Attempt.job_id == self.job_id, Attempt.attempt == self.rq_attempt,
                                         Attempt.worker_id.is_(None), placed_here)  # type: ignore[union-attr]
                .values(worker_id=self.worker_id, started_at=utcnow())).rowcount
            if adopted != 1:
                self.session.rollback()
                raise TransitionRefused(self.job_id, f"not placed on {self.worker_id} at attempt {self.rq_attempt}, "
                                                     "or adopted already", Status.RUNNING)
            self.session.exec(sa.update(Job).where(Job.id == self.job_id, Job.attempt == self.rq_attempt)  # type: ignore[call-overload]
                              .values(run_dir=str(run_dir), lease_expires_at=db_now(self.session, self.settings.lease_ttl_s)))
            self.session.commit()
            job = self.session.get(Job, self.job_id, populate_existing=True)
            assert job is not None
            return job

        job = self._db(claim, "adopting the attempt")
        self.lease_ok = time.monotonic()
        self.attempt = job.attempt
        self.placement = job.placement
        parallel = job.spec.get("parallel") or {}
        self.nnodes = 1 if self.executor.allocates_nodes else int(parallel.get("nnodes", 1))
        log.info("job %s attempt %d: adopted on %s (%s)", job.id, job.attempt, self.worker_id, job.placement, extra=self.log_extra)
        # Detached, fully loaded: a later rollback cannot expire it into a query against a dead database.
        self.session.expunge(job)
        return job

    def _end_identity(self) -> None:
        if self.identity is not None and self.attempt is not None:
            self.isolation.end(self.session, self.job_id, self.attempt, self.identity)
            self.identity = None

    def _gpus(self) -> tuple[int, ...] | None:
        """Node 0's GPUs as placed (its ranks see only these); None where the executor's engine places the ranks."""
        return None if self.executor.allocates_nodes else nodes.node_gpus(self.placement, 0)

    def _gpu_count(self) -> int:
        gpus = self._gpus()
        return devices.gpu_count(self.settings) if gpus is None else len(gpus)

    def _prepare(self, job: Job, spec: AnySpec, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        run_dirs.scrub(run_dir, job.attempt)  # what an earlier attempt planted where the worker writes
        (run_dir / "logs" / f"attempt-{job.attempt}").mkdir(parents=True, exist_ok=True)
        # As placed on this worker: nproc_per_node 'gpu' is a number here.
        _write_atomic(run_dir / SPEC_FILE, json.dumps(spec.visible_dump(), indent=2))
        (run_dir / ERROR_FILE).unlink(missing_ok=True)
        # Catalog checkpoints are adopted into the run directory; a script finds its own via report.resume_path().
        if spec.kind == "catalog" and job.resume_from and not (run_dir / "checkpoints" / "latest").exists():
            _adopt_checkpoint(Path(job.resume_from), run_dir / "checkpoints")

    def _run_attempt(self, job: Job) -> str:
        run_dir = Path(job.run_dir or "")
        self.tail = EventTail(run_dir / "events.jsonl")
        self.found = Found(run_dir, enabled=False)  # until the spec says what to look for
        refused = self.isolation.owner_refused(self.redis, job.owner)
        if refused is not None:
            self._gang_stop_quietly()
            return self._fail_or_retry(job, outcome.Failure(ErrorType.SPEC, refused, None, None), retry=False)
        try:
            spec = spec_from_dict(devices.place(job.spec, self._gpu_count(), self.worker_id, self.settings.spec_limits()))
        except devices.PlacementError as exc:
            self._gang_stop_quietly()
            # Another attempt on this worker would fail the same way.
            return self._fail_or_retry(job, outcome.Failure(ErrorType.SPEC, str(exc), None, None), retry=False)
        self.found = found_in_run(run_dir, spec, job.created_at)
        try:
            self._prepare(job, spec, run_dir)
            # the uploaded bundle and the requirements environment (worker/job_code.py)
            job_code.prepare(self.settings, job, spec, run_dir, keep_going=lambda: self._setup_keep_going(job))
            self.identity = self._db(lambda: self.isolation.take(self.session, job.id, job.attempt, run_dir), "leasing a uid")
        except NoFreeUid as exc:
            self._gang_stop_quietly()
            return self._fail_or_retry(job, outcome.Failure(ErrorType.INTERNAL, str(exc), None, None))
        except (job_code.SetupFailed, job_code.SetupInterrupted) as exc:
            return self._setup_ended(job, exc)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return self._disk_full(job, exc, run_dir)
        spec = devices.cpu_env(spec, self._gpu_count())
        # A resuming attempt of a script gets its resume_args with the latest checkpoint found (worker/found.py).
        spec, self.resumed_step = resume_arguments(spec, self.found, job.attempt > 1 or bool(job.resume_from), job.resume_from)
        node: NodeLaunch | None = None
        if self.nnodes > 1:
            # spec.json is written and the job row says running: once the endpoint is in SQL, the other nodes start.
            endpoint = nodes.rendezvous_endpoint(self.settings)
            node = nodes.node_launch(self.settings, job.id, job.attempt, self.nnodes, 0, endpoint)
            self._db(lambda: nodes.say(self.session, job.id, job.attempt, self.worker_id, nodes.ENDPOINT, endpoint),
                     "publishing the rendezvous endpoint")
            log.info("job %s attempt %d: gang of %d meets at %s", job.id, job.attempt, self.nnodes, endpoint, extra=self.log_extra)
        request = LaunchRequest(job_id=job.id, attempt=job.attempt, run_dir=run_dir, spec=spec, resume_from=job.resume_from,
                                node=node, identity=self.identity, gpus=self._gpus())
        self._stop_earlier_attempts(job, request)
        try:
            secrets = self._db(lambda: rank_secrets(self.session, job.id, self.settings), "reading the job's secrets")
            self.launch = launch = self.executor.start(dataclasses.replace(request, secrets=secrets))
        except (SpecError, LaunchError) as exc:
            # SpecError: the code root changed under an accepted job: nothing outside it may run, and retrying cannot help.
            self._gang_stop_quietly()
            return self._launch_refused(job, exc)
        self._record_executor_id(job, launch.executor_id)
        self._start_watchdog()
        log.info("job %s attempt %d: started by the %s executor%s", job.id, job.attempt, self.executor.name,
                 f" as {launch.executor_id}" if launch.executor_id else "", extra=self.log_extra)
        ended = self._watch(job, spec)
        self._stop_watchdog()  # the ranks are gone: nothing left for it to stop
        if isinstance(ended, str):
            return ended

        code = ended.exit_code
        if self.watchdog_fired:
            # Not the training's fault: like a lost worker, requeued without spending a retry (if still ours).
            self._gang_stop_quietly()
            what = f"lease not renewed within {0.8 * self.settings.lease_ttl_s:.1f}s; ranks stopped"
            return self._requeue(job, reason=f"{what}; requeued", outcome_name="lost", consume_retry=False, exit_code=code,
                                 error=outcome.Failure(ErrorType.WORKER_LOST, what, None, code))
        self.executor.release(launch)  # strays such as data-loader workers orphaned by a dead rank
        if code != 0:
            self._gang_stop()  # node 0 failed: no follower may run on alone
        lost = self._gang_lost() if code != 0 else []
        self._gang_stop()  # whatever did not finish by now stops
        self._ingest(final=True)
        if self.tail.bad is not None:
            return self._bad_event(job, code)
        if self._status() == Status.CANCELLING:
            return self._finish(job, Status.CANCELLED, reason="cancelled by user", outcome="cancelled")
        if code == 0 and ended.reason is None:
            alone = pg_watch.warning(run_dir / "logs" / f"attempt-{job.attempt}")
            return self._finish(job, Status.SUCCEEDED, reason="torchrun exited 0" + (f"; {alone}" if alone else ""),
                                outcome="succeeded", exit_code=0)
        if ended.reason is not None or ended.phase is Phase.GONE:
            return self._engine_ended(job, ended)
        if outcome.was_preempted(code, self.last_phase):
            return self._requeue(job, reason="preempted; resumes from its checkpoint", outcome_name="preempted",
                                 consume_retry=False, exit_code=code)
        if self.nnodes > 1 and not lost and self.last_phase == "done":
            return self._done_despite(job, f"node 0's torchrun exited with code {code}")
        if lost:
            # Node 0's ranks failed because a peer node vanished: the node's loss is the cause, not the training.
            what = ", ".join(f"node {r} (host {h})" for r, h in lost) + " lost"
            return self._node_lost(job, what, code)
        failure = outcome.failure(code, run_dir / ERROR_FILE, launch.launcher_log)
        if failure.traceback is None:
            failure = self._gang_failure(run_dir, job.attempt) or failure
        return self._fail_or_retry(job, failure)

    # ------------------------------------------------------------ the executor (worker/executors/)

    def _launch_refused(self, job: Job, exc: SpecError | LaunchError) -> str:
        if isinstance(exc, LaunchError) and exc.transient:
            # The engine's controller did not answer: not the job's fault, as a lost worker.
            return self._node_lost(job, f"the {self.executor.name} executor could not start the attempt: {exc}", None)
        message = str(exc) if isinstance(exc, SpecError) else f"the {self.executor.name} executor refused the attempt: {exc}"
        # The same request would be refused again: no retry.
        return self._fail_or_retry(job, outcome.Failure(ErrorType.SPEC, message, None, None), retry=False)

    def _record_executor_id(self, job: Job, executor_id: str | None) -> None:
        """The engine's name of the attempt (the Slurm job id), in the job and the attempt as soon as it exists:
        an operator finds it in squeue, and a later attempt stops it if this worker vanishes."""
        if executor_id is None:
            return
        self.session.exec(sa.update(Job).where(Job.id == job.id, Job.attempt == job.attempt)  # type: ignore[call-overload]
                          .values(executor_id=executor_id))
        row = self.session.get(Attempt, (job.id, job.attempt))
        if row is not None:
            row.executor_id = executor_id
            self.session.add(row)
        self.session.commit()

    def _stop_earlier_attempts(self, job: Job, request: LaunchRequest) -> None:
        """An earlier attempt whose worker vanished may still run in the engine (a Slurm job outlives the worker
        that submitted it); two attempts must never write one run directory. It gets the grace to checkpoint."""
        rows = self.session.exec(sa.select(Attempt).where(  # type: ignore[call-overload]
            Attempt.job_id == job.id, Attempt.attempt < job.attempt, Attempt.executor_id.is_not(None))).scalars().all()  # type: ignore[union-attr]
        self.session.commit()
        for row in rows:
            try:
                earlier = self.executor.attach(dataclasses.replace(request, attempt=row.attempt), row.executor_id)
                if self.executor.poll(earlier).ended:
                    continue
            except LaunchError as exc:
                log.warning("job %s: attempt %d (%s) cannot be checked: %s", job.id, row.attempt, row.executor_id, exc,
                            extra=self.log_extra)
                continue
            log.warning("job %s: attempt %d (%s) still runs; stopping it", job.id, row.attempt, row.executor_id,
                        extra=self.log_extra)
            self.executor.stop(earlier, self.settings.stop_grace_s, on_wait=lambda: self._heartbeat(job.attempt))

    def _engine_ended(self, job: Job, state: RankState) -> str:
        """An end the engine explains: the verdict the same end gets on a local worker (executors/base.py)."""
        verdict = engine_verdict(state)
        if verdict is None:  # gone without a word: the engine lost the attempt, as a vanished worker
            if self.last_phase == "done":
                return self._done_despite(job, state.detail or "the attempt vanished from the executor")
            return self._node_lost(job, state.detail or "the executor lost the attempt", state.exit_code)
        if verdict.error_type is ErrorType.WORKER_LOST:
            return self._node_lost(job, verdict.message, state.exit_code)
        if verdict.error_type is ErrorType.PREEMPTED:
            return self._requeue(job, reason=verdict.message, outcome_name="preempted", consume_retry=False,
                                 exit_code=state.exit_code)
        log_tail = outcome.tail(self.launch.launcher_log) if self.launch is not None else ""
        return self._fail_or_retry(job, outcome.Failure(verdict.error_type, verdict.message, None, state.exit_code,
                                                        log_tail or None), retry=verdict.retry)

    def _setup_keep_going(self, job: Job) -> bool:
        """Polled while the job's environment is built: heartbeat now and then; False once the job must stop."""
        now = time.monotonic()
        if now >= self._setup_beat:
            with contextlib.suppress(SQLAlchemyError):
                if not self._heartbeat(job.attempt):
                    return False
                self._setup_beat = now + self.settings.lease_ttl_s / 3
        with contextlib.suppress(SQLAlchemyError):
            if self._status(retried=False) == Status.CANCELLING:
                return False
        return not self.preempt_requested and not self.stop_request

    def _setup_ended(self, job: Job, exc: Exception) -> str:
        self._gang_stop_quietly()
        if isinstance(exc, job_code.SetupFailed):
            # Installing the same requirements again would fail the same way: no retry.
            return self._fail_or_retry(job, outcome.Failure(ErrorType.SETUP, str(exc), None, None, exc.log_tail), retry=False)
        if self._status() == Status.CANCELLING:
            return self._finish(job, Status.CANCELLED, reason="cancelled by user", outcome="cancelled")
        if self.preempt_requested:
            return self._requeue(job, reason="worker stopped (preempted) while preparing the job", outcome_name="preempted",
                                 consume_retry=False, exit_code=None)
        if self.stop_request:
            return self._requeue(job, reason=f"{self.stop_request} (while preparing the job)", outcome_name="preempted",
                                 consume_retry=False, exit_code=None, extra={"waiting_reason": self.stop_request})
        return "lost ownership"

    def _watch(self, job: Job, spec: AnySpec) -> RankState | str:
        """Loop until the ranks end (their final state) or the attempt is ended here (the verdict)."""
        assert self.launch is not None
        clock = _Watch(last_heartbeat_ok=time.monotonic())
        ttl = self.settings.lease_ttl_s
        while not (state := self.executor.poll(self.launch)).ended:
            now = time.monotonic()
            if clock.started is None and state.phase is Phase.RUNNING:
                clock.started = now
            try:
                if self._ingest():
                    clock.last_progress = now
                if now >= clock.next_heartbeat:
                    if not self._heartbeat(job.attempt):
                        # The reconciler gave the job to someone else: no process of ours may write on.
                        self._gang_stop()
                        self._kill_own()
                        return "lost ownership"
                    clock.last_heartbeat_ok, clock.next_heartbeat = now, now + ttl / 3
                status = self._status()
            except Fenced as exc:
                log.warning("%s; stopping this attempt's processes", exc, extra=self.log_extra)
                self._gang_stop_quietly()
                self._kill_own()
                return "lost ownership"
            except SQLAlchemyError as exc:
                # self.job_id, never job.id: reading an expired row would query the unreachable database again.
                log.warning("job %s: database unreachable (%s)", self.job_id, exc.__class__.__name__, extra=self.log_extra)
                with contextlib.suppress(SQLAlchemyError):
                    self.session.rollback()
                now = time.monotonic()
                if self.lease_lost:
                    self._gang_stop_quietly()
                    self._kill_own()
                    return "lost ownership"
                if now - max(clock.last_heartbeat_ok, self.lease_ok) > ttl * 0.8:
                    # Our lease is about to lapse and someone may take the job over: stop writing first.
                    self._gang_stop_quietly()
                    self._kill_own()
                    return "lost ownership (database unreachable)"
                time.sleep(self.settings.poll_interval_s)
                continue

            if self.tail.bad is not None:
                code = self._stop(job)
                return self._bad_event(job, code)
            if status == Status.CANCELLING:
                self._stop(job)
                return self._finish(job, Status.CANCELLED, reason="cancelled by user", outcome="cancelled")
            if self.preempt_requested:
                code = self._stop(job)
                return self._requeue(job, reason="worker stopped (preempted); resumes from its checkpoint",
                                     outcome_name="preempted", consume_retry=False, exit_code=code)
            if self.stop_request and status == Status.RUNNING:
                return self._make_room(job, self.stop_request)
            if state.reason is not None:  # still pending, and the engine says it can never run as asked
                self._stop(job)
                return self._engine_ended(job, state)
            if clock.started is not None and now - clock.started > spec.timeout_s:
                code = self._stop(job)
                return self._fail_or_retry(job, outcome.Failure(
                    ErrorType.TIMEOUT, f"timeout: attempt ran longer than timeout_s={spec.timeout_s}", None, code), retry=False)
            # After "done" (last step and final checkpoint stored) nothing more is said: a slow teardown is not a stall.
            if (spec.stall_timeout_s and clock.last_progress is not None and self.last_phase != "done"
                    and now - clock.last_progress > spec.stall_timeout_s):
                code = self._stop(job)
                return self._fail_or_retry(job, outcome.Failure(
                    ErrorType.STALLED, f"stalled: no progress from rank 0 for {spec.stall_timeout_s}s", None, code))
            time.sleep(self.settings.poll_interval_s)
        return state

    # ------------------------------------------------------------ steps

    def _stop(self, job: Job) -> int | None:
        def keep_lease() -> None:
            # The grace period can outlast the lease; without heartbeats a reconciler would take the job mid-stop.
            with contextlib.suppress(SQLAlchemyError, Fenced):  # the final ingest reads these lines again, or is fenced too
                self._ingest()
            self._try_heartbeat()

        # Every node gets its stop at about the same time: a checkpoint on SIGTERM is a collective.
        self._gang_stop()
        assert self.launch is not None
        code = self.executor.stop(self.launch, self.settings.stop_grace_s, on_wait=keep_lease).exit_code
        self._ingest(final=True)
        return code

    def _make_room(self, job: Job, why: str) -> str:
        """The scheduler needs this job's devices (preemption, a sweep pausing a trial): SIGTERM with the grace to
        checkpoint, then back in line without spending a retry; the next attempt resumes from that checkpoint."""
        log.info("job %s: %s; stopping the ranks with %.0fs to checkpoint", job.id, why, self.settings.stop_grace_s,
                 extra=self.log_extra)
        code = self._stop(job)
        if code == 0 and self.last_phase == "done":  # it finished within the grace: nothing left to resume
            return self._finish(job, Status.SUCCEEDED, reason=f"training done while stopping ({why})", outcome="succeeded",
                                exit_code=0)
        return self._requeue(job, reason=f"{why}; resumes from its checkpoint", outcome_name="preempted", consume_retry=False,
                             exit_code=code, extra={"waiting_reason": why, "queue_position": None})

    def _ingest(self, final: bool = False) -> int:
        """Store what rank 0 appended, then what the job wrote without the SDK (worker/found.py); the tails
        move past it only once the rows are committed."""
        events = self.tail.read()
        batch = self.settings.ingest_batch

        def store() -> int:
            return sum(ingest_events(self.session, self.job_id, events[i:i + batch], guard=self._fence())
                       for i in range(0, len(events), batch))

        stored = self._db(store, "storing events") if events else 0
        self.tail.ack()
        for event in events:
            if event.get("type") == "status":
                self.last_phase = event.get("phase")
        return stored + self.found.ingest(self.session, self.job_id, self._fence(), self._db, batch, final=final)

    # ------------------------------------------------------------ database calls through a blip

    def _fence(self) -> list[object]:
        """Conditions every write of this supervisor carries, checked in its own transaction: the job still runs
        this attempt on this worker. The reconciler's requeue bumps the attempt, so a stale supervisor (frozen,
        partitioned) that wakes up writes nothing."""
        return [Job.attempt == self.attempt, Job.worker_id == self.worker_id,
                Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value])]  # type: ignore[attr-defined]

    def _kill_own(self) -> None:
        """Kill every process of this attempt (on this node) at once, from any thread; a newer attempt's live on."""
        if self.launch is not None:
            self.executor.kill(self.launch)

    def _start_watchdog(self) -> None:
        """Stops the ranks once the lease went unrenewed for 0.8 TTL, even while the main thread hangs in a
        database call: past that point the reconciler may hand the job to another worker."""
        self._watchdog_done = threading.Event()
        limit = self.settings.lease_ttl_s * 0.8

        def watch() -> None:
            while not self._watchdog_done.wait(min(0.5, limit / 4)):
                late = time.monotonic() - self.lease_ok
                if late > limit:
                    log.error("job %s: lease not renewed for %.1fs (limit %.1fs); stopping attempt %s's processes",
                              self.job_id, late, limit, self.attempt, extra=self.log_extra)
                    self.watchdog_fired = True
                    self._kill_own()
                    return

        threading.Thread(target=watch, name=f"lease-watchdog-{self.job_id}", daemon=True).start()

    def _stop_watchdog(self) -> None:
        done = getattr(self, "_watchdog_done", None)
        if done is not None:
            done.set()

    def _lease_deadline(self) -> float:
        """Monotonic time after which the lease may lapse unseen: stop retrying and stop writing."""
        return self.lease_ok + self.settings.lease_ttl_s * 0.8

    def _db(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` retried through transient database and Redis errors while the lease lasts. Between tries the
        session is rolled back and the lease renewed, so a blip shorter than the lease costs nothing."""

        def between_tries() -> None:
            with contextlib.suppress(SQLAlchemyError):
                self.session.rollback()
            self._try_heartbeat()

        def out_of_time() -> bool:
            return self.lease_lost or time.monotonic() >= self._lease_deadline()

        return retry.call(fn, deadline=out_of_time, what=f"job {self.job_id}: {what}", on_retry=between_tries)

    def _try_heartbeat(self) -> None:
        """One heartbeat, errors swallowed: a renewal extends the retry deadline, a refusal ends it."""
        if self.attempt is None:
            return
        try:
            self._heartbeat(self.attempt)
        except SQLAlchemyError:
            with contextlib.suppress(SQLAlchemyError):
                self.session.rollback()

    def _heartbeat(self, attempt: int) -> bool:
        result = self.session.exec(  # type: ignore[call-overload]
            sa.update(Job)
            .where(Job.id == self.job_id, Job.worker_id == self.worker_id, Job.attempt == attempt,
                   Job.status.in_([Status.RUNNING.value, Status.CANCELLING.value]))  # type: ignore[attr-defined]
            .values(lease_expires_at=db_now(self.session, self.settings.lease_ttl_s))
        )
        self.session.commit()
        if result.rowcount == 1:
            self.lease_ok = time.monotonic()
            return True
        self.lease_lost = True
        return False

    def _status(self, retried: bool = True) -> Status:
        def read() -> Status:
            value, self.stop_request = self.session.exec(  # type: ignore[call-overload]
                sa.select(Job.status, Job.stop_request).where(Job.id == self.job_id)).one()
            self.session.commit()
            return Status(value)

        return self._db(read, "reading the status") if retried else read()

    def _record_attempt(self, job: Job, outcome_name: str, exit_code: int | None, error_type: str | None) -> None:
        resumed = _resumed_from(self.tail.path)
        if resumed is None:
            resumed = getattr(self, "resumed_step", None)

        def record() -> None:
            # Only while this supervisor still holds the job: a stale one must not rewrite the reconciler's "lost".
            holds = sa.exists().where(Job.id == self.job_id, *self._fence())
            self.session.exec(  # type: ignore[call-overload]
                sa.update(Attempt).where(Attempt.job_id == job.id, Attempt.attempt == job.attempt, holds)
                .values(finished_at=utcnow(), outcome=outcome_name, exit_code=exit_code, error_type=error_type,
                        resumed_from_step=resumed))
            self.session.commit()

        self._db(record, "recording the attempt")
        mlflow_runs.settle(Path(job.run_dir or ""), outcome_name, self.settings.mlflow_tracking_uri)

    def _transition(self, to: Status, *, expect: list[Status], reason: str, values: dict[str, object] | None) -> Job:
        return self._db(lambda: transition(self.session, self.job_id, to, expect=expect, reason=reason, values=values,
                                           guard=self._fence()),
                        f"moving the job to {to.value}")

    def _finish(self, job: Job, to: Status, *, reason: str, outcome: str, exit_code: int | None = None) -> str:
        self._record_attempt(job, outcome, exit_code, None)
        try:
            self._transition(to, expect=[Status.RUNNING, Status.CANCELLING], reason=reason,
                             values={"exit_code": exit_code} if exit_code is not None else None)
        except TransitionRefused as exc:
            log.warning("job %s: final transition refused (%s)", job.id, exc, extra=self.log_extra)
        return to.value

    def _requeue(self, job: Job, *, reason: str, outcome_name: str, consume_retry: bool,
                 exit_code: int | None, error: outcome.Failure | None = None, extra: dict[str, object] | None = None) -> str:
        self._record_attempt(job, outcome_name, exit_code, error.type.value if error else ErrorType.PREEMPTED.value)
        values: dict[str, object] = {
            "attempt": Job.attempt + 1, "worker_id": None, "lease_expires_at": None, "exit_code": exit_code, **(extra or {}),
        }
        if not consume_retry:
            values["max_attempts"] = Job.max_attempts + 1
        if error is not None:
            values.update(_error_values(error))
        try:
            fresh = self._transition(Status.QUEUED, expect=[Status.RUNNING], reason=reason, values=values)
        except TransitionRefused as exc:
            log.warning("job %s: requeue refused (%s)", job.id, exc, extra=self.log_extra)
            return "requeue refused"
        log.info("job %s: back in line at attempt %d; the scheduler places it again", fresh.id, fresh.attempt, extra=self.log_extra)
        return "requeued"

    def _fail_or_retry(self, job: Job, error: outcome.Failure, retry: bool = True) -> str:
        if retry and error.type == ErrorType.OOM:
            spec = spec_from_dict(job.spec)
            ranks = spec.parallel.world_size if spec.parallel.ranks_known else spec.parallel.nnodes * self._gpu_count()
            halved = oom.halved_micro_batch(job.spec, job.attempt, ranks)
            if halved is not None:
                # The remedy is the change itself, so it spends no retry; halvings are bounded by the micro-batch.
                adjusted, change = halved
                return self._requeue(
                    job, reason=f"attempt {job.attempt} ran out of memory; retrying with micro-batch "
                                f"{change['micro_batch']['to']} x grad_accum_steps {change['to']}",
                    outcome_name="failed", consume_retry=False, exit_code=error.exit_code, error=error,
                    extra={"spec": adjusted, "adjustments": [*job.adjustments, change]},
                )
        if retry and job.attempt < job.max_attempts:
            return self._requeue(job, reason=f"attempt {job.attempt} failed ({error.type.value}); retrying",
                                 outcome_name="failed", consume_retry=True, exit_code=error.exit_code, error=error)
        self._record_attempt(job, "failed", error.exit_code, error.type.value)
        try:
            self._transition(Status.FAILED, expect=[Status.RUNNING, Status.CANCELLING], reason=error.message[:500],
                             values=_error_values(error))
        except TransitionRefused as exc:
            log.warning("job %s: fail refused (%s)", job.id, exc, extra=self.log_extra)
        return Status.FAILED.value


def _error_values(error: outcome.Failure) -> dict[str, object]:
    return {"error_type": error.type.value, "error_message": error.message, "error_traceback": error.traceback,
            "error_log_tail": error.log_tail, "exit_code": error.exit_code}


def _resumed_from(events_path: Path) -> int | None:
    """The step the attempt's trainer resumed from, as its 'training' status event says."""
    step = None
    try:
        with events_path.open("rb") as f:
            for line in f:
                if b'"phase":"training"' in line:
                    step = json.loads(line).get("resumed_from_step")
    except (OSError, ValueError):
        return None
    return step


def _adopt_checkpoint(source: Path, checkpoints: Path) -> None:
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
    _write_atomic(checkpoints / "latest", source.name)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as exc:
        exc.filename = exc.filename or str(path)  # a failed write() names no file; the job's error must
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
