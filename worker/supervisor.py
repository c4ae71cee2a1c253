"""The RQ job function: node 0's task for one attempt of one job, from its adoption to its verdict.

The scheduler placed the attempt (queued -> running, jobs/scheduling/scheduler.py). ``Supervisor.run`` reads top to bottom:
adopt it and take its lease (worker/lease.py); prepare its run directory, code and environment; launch its ranks
through the executor; watch them (tail events.jsonl into SQL, heartbeat the lease, stop them for a cancel, a timeout, a
stall, a stopping host, the scheduler's stop request: worker/watch_rules.py, pure) until they end or are stopped; judge
why they stopped (worker/verdicts.py, pure); record the verdict (worker/verdict_record.py): succeeded | failed | cancelled | queued
again (a retry, a preemption, a lost node).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import time
from pathlib import Path
from types import FrameType

import sqlalchemy as sa
from redis import Redis
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs.infra import queue
from jobs.settings import Settings, get_settings
from jobs.store.db import get_engine
from jobs.store.ingest import Fenced
from jobs.store.models import ErrorType, Job, Status
from jobs.store.states import TransitionRefused
from jobs.sweeps.pauses import trial_pause
from jobspec.pdeathsig import set_not_dumpable
from jobspec.rank_logs import process_group_warning
from jobspec.spec import AnySpec, SpecError, spec_from_dict
from jobspec.view import StoredSpec
from worker import attempt_dir, devices, executor_attempts, job_code, outcome, uploads, verdict_record
from worker import node as nodes
from worker.executors import make_executor
from worker.executors.base import Launch, LaunchError, LaunchRequest, RankState
from worker.found import found_in_run, resume_arguments
from worker.gang_control import Gang
from worker.intake import Intake
from worker.launch import ERROR_FILE, rank_secrets
from worker.lease import Lease
from worker.outcome import Failure
from worker.sandbox.isolation import Isolation
from worker.sandbox.job_users import JobIdentity
from worker.sandbox.uid_leases import NoFreeUid
from worker.verdicts import Facts, Stop, Why, judge
from worker.watch_rules import Clocks, stop_now

log = logging.getLogger(__name__)


def worker_id(settings: Settings) -> str:
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"


def run_node(job_id: str, attempt: int, node_rank: int) -> str:
    """One node task of a placement (jobs.scheduling.scheduler.NODE_TASK): node 0 supervises the job, any other follows it."""
    settings = get_settings()
    set_not_dumpable()  # the work horse holds the service's settings; its jobs run as the same user
    engine = get_engine(settings.database_url)
    # Each task is a forked child of the worker (worker/host_runner.py): inherited connections must not be shared.
    engine.dispose(close=False)
    if node_rank == 0:
        return Supervisor(job_id, attempt, settings, engine, queue.redis_client(settings.redis_url)).run()
    return nodes.Follower(job_id, attempt, node_rank, settings, Session(engine, expire_on_commit=False)).run()


class Supervisor:
    """Node 0's task for one attempt: the lease (worker/lease.py), the gang (worker/gang_control.py), the run
    directory (worker/attempt_dir.py), the executor's ranks and the watch; the verdict is worker/verdicts.py's."""

    def __init__(self, job_id: str, attempt: int, settings: Settings, engine: Engine, redis: Redis):
        self.job_id, self.rq_attempt = job_id, attempt
        self.settings, self.engine, self.redis = settings, engine, redis
        self.worker_id = worker_id(settings)
        self.session = Session(engine, expire_on_commit=False)
        self.log_extra = {"job_id": job_id}
        self.preempt_requested = False
        self.pause_at: str | None = None
        # Set by the scheduler (jobs/scheduling/stops.py) when this job must make room: checkpoint, then back in line.
        self.stop_request: str | None = None
        self._setup_beat = 0.0  # next heartbeat while the job's environment is built
        self.lease = Lease(job_id, self.worker_id, settings, self.session)
        # nnodes > 1 once claimed: this supervisor is node 0 of a gang.
        self.gang = Gang(self.lease)
        self.spec: AnySpec | None = None  # as prepared for this worker
        self.resumed_step: int | None = None
        # Where the ranks run (worker/executors/): this class never learns which one.
        self.executor = make_executor(settings)
        self.launch: Launch | None = None
        self.isolation = Isolation(settings, self.worker_id)
        self.identity: JobIdentity | None = None  # the attempt's uid and cgroup, once leased
        self.uploads = uploads.Uploads(None, job_id, Path())  # to the object store, once the run directory is ready

    def run(self) -> str:
        # The worker process forwards SIGTERM (docker stop, node drain) to this task.
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            try:
                job = self._adopt()
            except TransitionRefused as exc:
                log.info("job %s: not started (%s)", self.job_id, exc, extra=self.log_extra)
                return f"skipped: {exc}"
            try:
                # Each step returns why the attempt stopped, or None where the next one takes over.
                stop = self._prepare(job) or self._launch(job) or self._watch(job)
                verdict = judge(stop, self._facts(job, stop))
                if verdict.status is not None:  # the job's files in the store before it is marked succeeded
                    self.uploads.finish(verdict.status is Status.SUCCEEDED, keep_going=self.lease.try_heartbeat)
                # No process of the attempt may outlive the status that says it ended: a user (or the next attempt's
                # placement) reading `cancelled` must find nothing of the job still running.
                self._end_identity()
                return verdict_record.record(self.lease, job, verdict, events=self.intake.tail.path,
                                             resumed_step=self.resumed_step, unreadable=self.intake.found.metrics.unreadable)
            except (Fenced, SQLAlchemyError) as exc:
                if isinstance(exc, Fenced):
                    log.warning("%s; stopping this attempt's processes", exc, extra=self.log_extra)
                else:  # unreachable past our lease: the reconciler requeues the job
                    log.error("job %s: database unreachable past the lease (%s); giving the attempt up", self.job_id,
                              exc.__class__.__name__, extra=self.log_extra)
                stop = self._give_up(Why.OWNERSHIP_LOST if isinstance(exc, Fenced) else Why.DATABASE_UNREACHABLE)
                return judge(stop, self._facts(job, stop)).reason
        finally:
            self.uploads.stop()
            self.lease.stop_watchdog()
            self._end_identity()
            signal.signal(signal.SIGTERM, previous)
            self.session.close()

    def _adopt(self) -> Job:
        """Adopt the attempt the scheduler placed here (worker/lease.py). Raises TransitionRefused otherwise."""
        job = self.lease.claim(self.rq_attempt)
        self.gang.placement = job.placement
        self.gang.nnodes = 1 if self.executor.allocates_nodes else StoredSpec.of(job.spec).nnodes
        log.info("job %s attempt %d: adopted on %s (%s)", job.id, job.attempt, self.worker_id, job.placement, extra=self.log_extra)
        return job

    def _prepare(self, job: Job) -> Stop | None:
        """The spec placed on this worker, the run directory, the job's code and environment, the uid of its ranks."""
        self.run_dir = run_dir = Path(job.run_dir or "")
        self.intake = Intake(self.lease, self.settings, run_dir)
        # Whatever an earlier attempt's rank 0 wrote that its supervisor never stored (killed by its lease watchdog,
        # or its worker died) is stored now, before this attempt can end or its ranks resume past those steps.
        self.intake.store()
        refused = self.isolation.owner_refused(self.redis, job.owner)
        if refused is not None:
            return self._not_started(Stop(Why.REFUSED, failure=Failure(ErrorType.SPEC, refused, None, None)))
        try:
            spec = spec_from_dict(devices.place(job.spec, self._gpu_count(), self.worker_id, self.settings.spec_limits()))
        except devices.PlacementError as exc:  # another attempt on this worker would fail the same way
            return self._not_started(Stop(Why.REFUSED, failure=Failure(ErrorType.SPEC, str(exc), None, None)))
        self.intake.found = found_in_run(self.settings, run_dir, spec, job.created_at)
        try:
            attempt_dir.prepare(run_dir, job.attempt, spec, job.resume_from)
            # What a resume needs that this host lacks, from the object store; then its uploads in the background.
            notes = [uploads.restore(self.settings, job.id, run_dir, keep_going=lambda: self._setup_keep_going(job),
                                     resume_from=job.resume_from if spec.kind == "catalog" else None)]
            self.uploads = uploads.Uploads.of(self.settings, job.id, run_dir, found=lambda: self.intake.found.recorded())
            self.uploads.start()
            # the uploaded bundle and the requirements environment (worker/job_code.py)
            job_code.prepare(self.settings, job, spec, run_dir, keep_going=lambda: self._setup_keep_going(job))
            if self.intake.found.enabled:  # a script's own checkpoints go into its working directory, made just now
                notes.append(uploads.restore_found(self.settings, job.id, run_dir,
                                                   keep_going=lambda: self._setup_keep_going(job)))
            self.identity = self.lease.db(lambda: self.isolation.take(self.session, job.id, job.attempt, run_dir), "leasing a uid")
        except NoFreeUid as exc:
            return self._not_started(Stop(Why.NO_FREE_UID, failure=Failure(ErrorType.INTERNAL, str(exc), None, None)))
        except job_code.SetupFailed as exc:  # installing the same requirements again would fail the same way
            return self._not_started(Stop(Why.REFUSED, failure=Failure(ErrorType.SETUP, str(exc), None, None, exc.log_tail)))
        except job_code.SetupInterrupted:
            return self._not_started(self._setup_interrupted())
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # Named as such (not a lost worker), and not retried: another attempt would write to the same volume.
            message = f"disk full: no space left on the device writing {exc.filename or getattr(exc, 'path', None) or run_dir}"
            log.error("job %s: %s", self.job_id, message, extra=self.log_extra)
            return self._not_started(Stop(Why.REFUSED, failure=Failure(ErrorType.DISK_FULL, message, None, None)))
        spec = devices.cpu_env(spec, self._gpu_count())
        # A resuming attempt of a script gets its resume_args with the latest checkpoint found (worker/found.py).
        resume = resume_arguments(spec, self.intake.found, job.attempt > 1 or bool(job.resume_from), job.resume_from)
        self.spec, self.resumed_step = resume.spec, resume.step
        if note := "; ".join(n for n in (*notes, resume.note) if n):
            verdict_record.note_attempt(self.lease, job, note)
        return None

    def _setup_keep_going(self, job: Job) -> bool:
        """Polled while the job's environment is built: heartbeat now and then; False once the job must stop."""
        now = time.monotonic()
        if now >= self._setup_beat:
            with contextlib.suppress(SQLAlchemyError):
                if not self.lease.heartbeat(job.attempt):
                    return False
                self._setup_beat = now + self.settings.lease_ttl_s / 3
        with contextlib.suppress(SQLAlchemyError):
            if self._status(retried=False) == Status.CANCELLING:
                return False
        return not self.preempt_requested and not self.stop_request

    def _setup_interrupted(self) -> Stop:
        """Why _setup_keep_going said stop."""
        if self._status() == Status.CANCELLING:
            return Stop(Why.CANCEL, preparing=True)
        if self.preempt_requested:
            return Stop(Why.HOST_STOPPING, preparing=True)
        if self.stop_request:
            return Stop(Why.MAKE_ROOM, detail=self.stop_request, preparing=True)
        return Stop(Why.OWNERSHIP_LOST, preparing=True)  # its heartbeat was refused

    def _not_started(self, stop: Stop) -> Stop:
        self.gang.stop_quietly()  # the other nodes wait for a rendezvous that will not come
        return stop

    def _launch(self, job: Job) -> Stop | None:
        """The ranks started by the executor, and the lease's watchdog armed."""
        assert self.spec is not None
        # spec.json is written and the job row says running: once the endpoint is in SQL, the other nodes start.
        node = self.gang.meet()
        self.pause_at = pause_at = self.lease.db(lambda: trial_pause(self.session, job.id, job.labels, self.spec.kind),  # type: ignore[union-attr]
                                                 "reading the trial's rung")
        request = LaunchRequest(job_id=job.id, attempt=job.attempt, run_dir=self.run_dir, spec=self.spec, resume_from=job.resume_from,
                                node=node, identity=self.identity, gpus=self._gpus(), owner=job.owner, pause_at=pause_at)
        executor_attempts.stop_earlier(self.session, self.executor, request, self.settings.stop_grace_s,
                                     on_wait=lambda: self.lease.heartbeat(job.attempt))
        name = self.executor.name
        try:
            secrets = self.lease.db(lambda: rank_secrets(self.session, job.id, self.settings), "reading the job's secrets")
            self.launch = launch = self.executor.start(dataclasses.replace(request, secrets=secrets))
        except SpecError as exc:  # the code root changed under an accepted job: nothing outside it may run
            return self._not_started(Stop(Why.REFUSED, failure=Failure(ErrorType.SPEC, str(exc), None, None)))
        except LaunchError as exc:
            if exc.transient:
                return self._not_started(Stop(Why.ENGINE_UNREACHABLE, detail=f"the {name} executor could not start the attempt: {exc}"))
            message = f"the {name} executor refused the attempt: {exc}"  # the same request would be refused again
            return self._not_started(Stop(Why.REFUSED, failure=Failure(ErrorType.SPEC, message, None, None)))
        executor_attempts.record_executor_id(self.session, job, launch.executor_id)
        self.lease.start_watchdog(self._kill_own)
        log.info("job %s attempt %d: started by the %s executor%s", job.id, job.attempt, name,
                 f" as {launch.executor_id}" if launch.executor_id else "", extra=self.log_extra)
        return None

    def _watch(self, job: Job) -> Stop:
        """Loop until the ranks end, or stop them; says why the attempt stopped."""
        assert self.launch is not None and self.spec is not None
        clock = Clocks(last_heartbeat_ok=time.monotonic())
        ttl = self.settings.lease_ttl_s
        while not (state := self.executor.poll(self.launch)).ended:
            now = time.monotonic()
            clock.saw(state, now)
            try:
                if self.intake.store():
                    clock.last_progress = now
                if now >= clock.next_heartbeat:
                    if not self.lease.heartbeat(job.attempt):
                        # The reconciler gave the job to someone else: no process of ours may write on.
                        return self._give_up(Why.OWNERSHIP_LOST)
                    clock.last_heartbeat_ok, clock.next_heartbeat = now, now + ttl / 3
                status = self._status()
            except SQLAlchemyError as exc:
                # self.job_id, never job.id: reading an expired row would query the unreachable database again.
                log.warning("job %s: database unreachable (%s)", self.job_id, exc.__class__.__name__, extra=self.log_extra)
                with contextlib.suppress(SQLAlchemyError):
                    self.session.rollback()
                if self.lease.lost:
                    return self._give_up(Why.OWNERSHIP_LOST)
                if time.monotonic() - max(clock.last_heartbeat_ok, self.lease.ok) > ttl * 0.8:
                    # Our lease is about to lapse and someone may take the job over: stop writing first.
                    return self._give_up(Why.DATABASE_UNREACHABLE)
                time.sleep(self.settings.poll_interval_s)
                continue
            stop = stop_now(self.spec, state, status, clock, now, bad_event=self.intake.bad, last_phase=self.intake.last_phase,
                            host_stopping=self.preempt_requested, stop_request=self.stop_request)
            if stop is not None:
                if stop.why is Why.MAKE_ROOM:
                    log.info("job %s: %s; stopping the ranks with %.0fs to checkpoint", job.id, stop.detail,
                             self.settings.stop_grace_s, extra=self.log_extra)
                return dataclasses.replace(stop, exit_code=self._stop())
            time.sleep(self.settings.poll_interval_s)
        return self._exited(job, state)

    def _exited(self, job: Job, state: RankState) -> Stop:
        """The ranks ended by themselves: what they and the other nodes left says why."""
        assert self.launch is not None
        self.lease.stop_watchdog()  # the ranks are gone: nothing left for it to stop
        code = state.exit_code
        if self.lease.watchdog_fired:
            self.gang.stop_quietly()
            # What the ranks wrote before they were stopped, while the fence still lets us (else the next attempt does).
            with contextlib.suppress(SQLAlchemyError, Fenced):
                self.intake.store(final=True)
            return Stop(Why.WATCHDOG, exit_code=code,
                        detail=f"lease not renewed within {0.8 * self.settings.lease_ttl_s:.1f}s; ranks stopped")
        self.executor.release(self.launch)  # strays such as data-loader workers orphaned by a dead rank
        lost: list[tuple[int, str]] = []
        if code != 0:
            self.gang.stop()  # node 0 failed: no follower may run on alone
            lost = self.gang.lost()
        self.gang.stop()  # whatever did not finish by now stops
        self.intake.store(final=True)
        if self.intake.bad is not None:
            return Stop(Why.BAD_EVENT, exit_code=code, detail=f"malformed event: {self.intake.bad}")
        if self._status() == Status.CANCELLING:
            return Stop(Why.CANCEL, exit_code=code)
        run_dir = self.run_dir
        if code == 0 and state.reason is None:
            alone = process_group_warning(run_dir / "logs" / f"attempt-{job.attempt}")
            return Stop(Why.EXITED, exit_code=code, state=state, detail=alone or "")
        failure = self.gang.failure(run_dir, job.attempt, outcome.failure(code, run_dir / ERROR_FILE, self.launch.launcher_log))
        return Stop(Why.EXITED, exit_code=code, state=state, failure=failure, lost_nodes=tuple(lost),
                    log_tail=outcome.tail(self.launch.launcher_log))

    def _stop(self) -> int | None:
        """Stop the ranks with the grace to checkpoint; their exit code."""
        def keep_lease() -> None:
            # The grace period can outlast the lease; without heartbeats a reconciler would take the job mid-stop.
            with contextlib.suppress(SQLAlchemyError, Fenced):  # the final ingest reads these lines again, or is fenced too
                self.intake.store()
            self.lease.try_heartbeat()

        # Every node gets its stop at about the same time: a checkpoint on SIGTERM is a collective.
        self.gang.stop()
        assert self.launch is not None
        code = self.executor.stop(self.launch, self.settings.stop_grace_s, on_wait=keep_lease).exit_code
        self.intake.store(final=True)
        return code

    def _facts(self, job: Job, stop: Stop) -> Facts:
        return verdict_record.facts(self.lease, job, stop, last_phase=self.intake.last_phase, nnodes=self.gang.nnodes,
                                    ranks=self.spec.parallel.world_size if self.spec is not None else 1, pause_at=self.pause_at)

    def _give_up(self, why: Why) -> Stop:
        """The job is another's now, or may be soon: no process of this attempt may run on."""
        self.gang.stop_quietly()
        self._kill_own()
        return Stop(why)

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        if not self.preempt_requested:  # a stopping host repeats its SIGTERM until the task ends
            log.warning("job %s: worker is stopping; preempting the attempt", self.job_id, extra=self.log_extra)
        self.preempt_requested = True

    def _end_identity(self) -> None:
        if self.identity is not None and self.lease.attempt is not None:
            self.isolation.end(self.session, self.job_id, self.lease.attempt, self.identity)
            self.identity = None

    def _gpus(self) -> tuple[int, ...] | None:
        """Node 0's GPUs as placed (its ranks see only these); None where the executor's engine places the ranks."""
        return None if self.executor.allocates_nodes else nodes.node_gpus(self.gang.placement, 0)

    def _gpu_count(self) -> int:
        gpus = self._gpus()
        return devices.gpu_count(self.settings) if gpus is None else len(gpus)

    def _kill_own(self) -> None:
        """Kill every process of this attempt (on this node) at once, from any thread; a newer attempt's live on."""
        if self.launch is not None:
            self.executor.kill(self.launch)

    def _status(self, retried: bool = True) -> Status:
        def read() -> Status:
            value, self.stop_request = self.session.exec(  # type: ignore[call-overload]
                sa.select(Job.status, Job.stop_request).where(Job.id == self.job_id)).one()
            self.session.commit()
            return Status(value)

        return self.lease.db(read, "reading the status") if retried else read()

