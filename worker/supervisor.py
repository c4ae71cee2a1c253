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
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import sqlalchemy as sa
from redis import Redis
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from jobs import queue
from jobs.db import get_engine
from jobs.ingest import Fenced, ingest_events
from jobs.models import ErrorType, Job, Status
from jobs.settings import Settings, get_settings
from jobs.states import TransitionRefused
from jobs.sweeps.pauses import trial_pause
from trainer import pg_watch
from trainer.exit_codes import PAUSED_PHASE
from trainer.pdeathsig import set_not_dumpable
from trainer.spec import AnySpec, SpecError, spec_from_dict
from trainer.spec_view import StoredSpec
from worker import attempt_dir, devices, engine_attempts, job_code, outcome
from worker import node as nodes
from worker.executors import make_executor
from worker.executors.base import Launch, LaunchError, LaunchRequest, Phase, RankState
from worker.found import Found, found_in_run, resume_arguments
from worker.gang_control import Gang
from worker.isolation import Isolation
from worker.job_users import JobIdentity
from worker.launch import ERROR_FILE, NodeLaunch, rank_secrets
from worker.lease import Lease
from worker.tail import EventTail
from worker.uid_leases import NoFreeUid
from worker.verdicts import Verdicts

log = logging.getLogger(__name__)

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


class Supervisor(Verdicts):
    """Node 0's task for one attempt: the lease (worker/lease.py), the gang (worker/gang_control.py), the run
    directory (worker/attempt_dir.py), the executor's ranks, the watch loop; the end's verdict is worker/verdicts.py."""

    def __init__(self, job_id: str, attempt: int, settings: Settings, engine: Engine, redis: Redis):
        self.job_id, self.rq_attempt = job_id, attempt
        self.settings, self.engine, self.redis = settings, engine, redis
        self.worker_id = worker_id(settings)
        self.session = Session(engine, expire_on_commit=False)
        self.log_extra = {"job_id": job_id}
        self.last_phase: str | None = None
        self.preempt_requested = False
        self.pause_at: str | None = None
        # Set by the scheduler (jobs/stops.py) when this job must make room: checkpoint, then back in line.
        self.stop_request: str | None = None
        self._setup_beat = 0.0  # next heartbeat while the job's environment is built
        self.lease = Lease(job_id, self.worker_id, settings, self.session)
        # nnodes > 1 once claimed: this supervisor is node 0 of a gang.
        self.gang = Gang(self.lease)
        self.resumed_step: int | None = None
        # Where the ranks run (worker/executors/): this class never learns which one.
        self.executor = make_executor(settings)
        self.launch: Launch | None = None
        self.isolation = Isolation(settings, self.worker_id)
        self.identity: JobIdentity | None = None  # the attempt's uid and cgroup, once leased

    @property
    def attempt(self) -> int | None:
        """The claimed attempt, a plain value: ORM rows expire on rollback."""
        return self.lease.attempt

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
                self.gang.stop_quietly()
                self._kill_own()
                return "lost ownership (database unreachable)"
        finally:
            self.lease.stop_watchdog()
            self._end_identity()
            signal.signal(signal.SIGTERM, previous)
            self.session.close()

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        if not self.preempt_requested:  # a stopping host repeats its SIGTERM until the task ends
            log.warning("job %s: worker is stopping; preempting the attempt", self.job_id, extra=self.log_extra)
        self.preempt_requested = True

    def _claim(self) -> Job:
        """Adopt the attempt the scheduler placed here (worker/lease.py). Raises TransitionRefused otherwise."""
        job = self.lease.claim(self.rq_attempt)
        self.gang.placement = job.placement
        self.gang.nnodes = 1 if self.executor.allocates_nodes else StoredSpec.of(job.spec).nnodes
        log.info("job %s attempt %d: adopted on %s (%s)", job.id, job.attempt, self.worker_id, job.placement, extra=self.log_extra)
        return job

    def _end_identity(self) -> None:
        if self.identity is not None and self.attempt is not None:
            self.isolation.end(self.session, self.job_id, self.attempt, self.identity)
            self.identity = None

    def _gpus(self) -> tuple[int, ...] | None:
        """Node 0's GPUs as placed (its ranks see only these); None where the executor's engine places the ranks."""
        return None if self.executor.allocates_nodes else nodes.node_gpus(self.gang.placement, 0)

    def _gpu_count(self) -> int:
        gpus = self._gpus()
        return devices.gpu_count(self.settings) if gpus is None else len(gpus)

    def _run_attempt(self, job: Job) -> str:
        run_dir = Path(job.run_dir or "")
        self.tail = EventTail(run_dir / "events.jsonl")
        self.found = Found(run_dir, enabled=False)  # until the spec says what to look for
        # Whatever an earlier attempt's rank 0 wrote that its supervisor never stored (killed by its lease watchdog,
        # or its worker died) is stored now, before this attempt can end or its ranks resume past those steps.
        self._ingest()
        refused = self.isolation.owner_refused(self.redis, job.owner)
        if refused is not None:
            self.gang.stop_quietly()
            return self._fail_or_retry(job, outcome.Failure(ErrorType.SPEC, refused, None, None), retry=False)
        try:
            spec = spec_from_dict(devices.place(job.spec, self._gpu_count(), self.worker_id, self.settings.spec_limits()))
        except devices.PlacementError as exc:
            self.gang.stop_quietly()
            # Another attempt on this worker would fail the same way.
            return self._fail_or_retry(job, outcome.Failure(ErrorType.SPEC, str(exc), None, None), retry=False)
        self.found = found_in_run(self.settings, run_dir, spec, job.created_at)
        try:
            attempt_dir.prepare(run_dir, job.attempt, spec, job.resume_from)
            # the uploaded bundle and the requirements environment (worker/job_code.py)
            job_code.prepare(self.settings, job, spec, run_dir, keep_going=lambda: self._setup_keep_going(job))
            self.identity = self.lease.db(lambda: self.isolation.take(self.session, job.id, job.attempt, run_dir), "leasing a uid")
        except NoFreeUid as exc:
            self.gang.stop_quietly()
            return self._fail_or_retry(job, outcome.Failure(ErrorType.INTERNAL, str(exc), None, None))
        except (job_code.SetupFailed, job_code.SetupInterrupted) as exc:
            return self._setup_ended(job, exc)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return self._disk_full(job, exc, run_dir)
        spec = devices.cpu_env(spec, self._gpu_count())
        # A resuming attempt of a script gets its resume_args with the latest checkpoint found (worker/found.py).
        resume = resume_arguments(spec, self.found, job.attempt > 1 or bool(job.resume_from), job.resume_from)
        spec, self.resumed_step = resume.spec, resume.step
        if resume.note:
            self._note_attempt(job, resume.note)
        node: NodeLaunch | None = None
        if self.gang.nnodes > 1:
            # spec.json is written and the job row says running: once the endpoint is in SQL, the other nodes start.
            endpoint = nodes.rendezvous_endpoint(self.settings)
            node = nodes.node_launch(self.settings, job.id, job.attempt, self.gang.nnodes, 0, endpoint)
            self.lease.db(lambda: nodes.say(self.session, job.id, job.attempt, self.worker_id, nodes.ENDPOINT, endpoint),
                          "publishing the rendezvous endpoint")
            log.info("job %s attempt %d: gang of %d meets at %s", job.id, job.attempt, self.gang.nnodes, endpoint, extra=self.log_extra)
        self.pause_at = pause_at = self.lease.db(lambda: trial_pause(self.session, job.id, job.labels, spec.kind),
                                                 "reading the trial's rung")
        request = LaunchRequest(job_id=job.id, attempt=job.attempt, run_dir=run_dir, spec=spec, resume_from=job.resume_from,
                                node=node, identity=self.identity, gpus=self._gpus(), owner=job.owner, pause_at=pause_at)
        engine_attempts.stop_earlier(self.session, self.executor, request, self.settings.stop_grace_s,
                                     on_wait=lambda: self.lease.heartbeat(job.attempt))
        try:
            secrets = self.lease.db(lambda: rank_secrets(self.session, job.id, self.settings), "reading the job's secrets")
            self.launch = launch = self.executor.start(dataclasses.replace(request, secrets=secrets))
        except (SpecError, LaunchError) as exc:
            # SpecError: the code root changed under an accepted job: nothing outside it may run, and retrying cannot help.
            self.gang.stop_quietly()
            return self._launch_refused(job, exc)
        engine_attempts.record_executor_id(self.session, job, launch.executor_id)
        self.lease.start_watchdog(self._kill_own)
        log.info("job %s attempt %d: started by the %s executor%s", job.id, job.attempt, self.executor.name,
                 f" as {launch.executor_id}" if launch.executor_id else "", extra=self.log_extra)
        ended = self._watch(job, spec)
        self.lease.stop_watchdog()  # the ranks are gone: nothing left for it to stop
        if isinstance(ended, str):
            return ended

        code = ended.exit_code
        if self.lease.watchdog_fired:
            # Not the training's fault: like a lost worker, requeued without spending a retry (if still ours).
            self.gang.stop_quietly()
            # What the ranks wrote before they were stopped, while the fence still lets us (else the next attempt does).
            with contextlib.suppress(SQLAlchemyError, Fenced):
                self._ingest(final=True)
            what = f"lease not renewed within {0.8 * self.settings.lease_ttl_s:.1f}s; ranks stopped"
            return self._requeue(job, reason=f"{what}; requeued", outcome_name="lost", consume_retry=False, exit_code=code,
                                 error=outcome.Failure(ErrorType.WORKER_LOST, what, None, code))
        self.executor.release(launch)  # strays such as data-loader workers orphaned by a dead rank
        if code != 0:
            self.gang.stop()  # node 0 failed: no follower may run on alone
        lost = self.gang.lost() if code != 0 else []
        self.gang.stop()  # whatever did not finish by now stops
        self._ingest(final=True)
        if self.tail.bad is not None:
            return self._bad_event(job, code)
        if self._status() == Status.CANCELLING:
            return self._finish(job, Status.CANCELLED, reason="cancelled by user", outcome="cancelled")
        if code == 0 and ended.reason is None and self.last_phase == PAUSED_PHASE:
            return self._paused(job)
        if code == 0 and ended.reason is None:
            alone = pg_watch.warning(run_dir / "logs" / f"attempt-{job.attempt}")
            return self._finish(job, Status.SUCCEEDED, reason="torchrun exited 0" + (f"; {alone}" if alone else ""),
                                outcome="succeeded", exit_code=0)
        if ended.reason is not None or ended.phase is Phase.GONE:
            return self._engine_ended(job, ended)
        if outcome.was_preempted(code, self.last_phase):
            return self._requeue(job, reason="preempted; resumes from its checkpoint", outcome_name="preempted",
                                 consume_retry=False, exit_code=code)
        if self.gang.nnodes > 1 and not lost and self.last_phase == "done":
            return self._done_despite(job, f"node 0's torchrun exited with code {code}")
        if lost:
            # Node 0's ranks failed because a peer node vanished: the node's loss is the cause, not the training.
            what = ", ".join(f"node {r} (host {h})" for r, h in lost) + " lost"
            return self._node_lost(job, what, code)
        failure = outcome.failure(code, run_dir / ERROR_FILE, launch.launcher_log)
        if failure.traceback is None:
            failure = self.gang.failure(run_dir, job.attempt) or failure
        return self._fail_or_retry(job, failure)

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
                    if not self.lease.heartbeat(job.attempt):
                        # The reconciler gave the job to someone else: no process of ours may write on.
                        self.gang.stop()
                        self._kill_own()
                        return "lost ownership"
                    clock.last_heartbeat_ok, clock.next_heartbeat = now, now + ttl / 3
                status = self._status()
            except Fenced as exc:
                log.warning("%s; stopping this attempt's processes", exc, extra=self.log_extra)
                self.gang.stop_quietly()
                self._kill_own()
                return "lost ownership"
            except SQLAlchemyError as exc:
                # self.job_id, never job.id: reading an expired row would query the unreachable database again.
                log.warning("job %s: database unreachable (%s)", self.job_id, exc.__class__.__name__, extra=self.log_extra)
                with contextlib.suppress(SQLAlchemyError):
                    self.session.rollback()
                now = time.monotonic()
                if self.lease.lost:
                    self.gang.stop_quietly()
                    self._kill_own()
                    return "lost ownership"
                if now - max(clock.last_heartbeat_ok, self.lease.ok) > ttl * 0.8:
                    # Our lease is about to lapse and someone may take the job over: stop writing first.
                    self.gang.stop_quietly()
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
            self.lease.try_heartbeat()

        # Every node gets its stop at about the same time: a checkpoint on SIGTERM is a collective.
        self.gang.stop()
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
            return sum(ingest_events(self.session, self.job_id, events[i:i + batch], guard=self.lease.fence())
                       for i in range(0, len(events), batch))

        stored = self.lease.db(store, "storing events") if events else 0
        self.tail.ack()
        for event in events:
            if event.get("type") == "status":
                self.last_phase = event.get("phase")
        return stored + self.found.ingest(self.session, self.job_id, self.lease.fence(), self.lease.db, batch, final=final)

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

