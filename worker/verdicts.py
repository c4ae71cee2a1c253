"""What an ended attempt becomes: succeeded, failed, cancelled, or back in line (a retry, a preemption, a lost
node), recorded in its attempt row and moved by a fenced transition. A mixin of the Supervisor
(worker/supervisor.py), which says why the attempt ended; this decides what that makes of the job."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import sqlalchemy as sa
from sqlmodel import Session

from jobs import gpu_faults
from jobs.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.reconciler import worker_losses
from jobs.settings import Settings
from jobs.states import TransitionRefused, transition
from trainer.spec import SpecError, spec_from_dict
from worker import job_code, mlflow_runs, oom, outcome
from worker.executors.base import Executor, Launch, LaunchError, RankState, engine_verdict
from worker.found import Found
from worker.gang_control import Gang
from worker.lease import Lease
from worker.tail import EventTail

log = logging.getLogger(__name__)


class Verdicts:
    """Needs the Supervisor's state below and its ``_gpu_count`` and ``_status``; every write goes through the
    lease's fence and retries."""

    job_id: str
    settings: Settings
    session: Session
    lease: Lease
    gang: Gang
    log_extra: dict[str, str]
    tail: EventTail
    executor: Executor
    launch: Launch | None
    last_phase: str | None
    preempt_requested: bool
    stop_request: str | None
    resumed_step: int | None
    pause_at: str | None
    found: Found

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
        if self.lease.db(lambda: worker_losses(self.session, job.id), "counting lost workers") < self.settings.max_worker_losses:
            return self._requeue(job, reason=f"{what}; requeued", outcome_name="lost", consume_retry=False,
                                 exit_code=code, error=error)
        return self._fail_or_retry(job, outcome.Failure(
            ErrorType.WORKER_LOST, f"{what}; {self.settings.max_worker_losses} workers lost already", None, code), retry=False)

    def _disk_full(self, job: Job, exc: OSError, run_dir: Path) -> str:
        """No space to prepare the run: named as such (not a lost worker), and not retried: another attempt would
        write to the same volume."""
        self.gang.stop_quietly()
        where = exc.filename or getattr(exc, "path", None) or run_dir
        message = f"disk full: no space left on the device writing {where}"
        log.error("job %s: %s", self.job_id, message, extra=self.log_extra)
        return self._fail_or_retry(job, outcome.Failure(ErrorType.DISK_FULL, message, None, None), retry=False)

    def _bad_event(self, job: Job, code: int | None) -> str:
        """The trainer wrote an event the service cannot store: the same code would write it again, so no retry."""
        bad = self.tail.bad
        log.error("job %s: malformed event (%s); failing the job", self.job_id, bad, extra=self.log_extra)
        return self._fail_or_retry(job, outcome.Failure(ErrorType.BAD_EVENT, f"malformed event: {bad}", None, code), retry=False)

    def _launch_refused(self, job: Job, exc: SpecError | LaunchError) -> str:
        if isinstance(exc, LaunchError) and exc.transient:
            # The engine's controller did not answer: not the job's fault, as a lost worker.
            return self._node_lost(job, f"the {self.executor.name} executor could not start the attempt: {exc}", None)
        message = str(exc) if isinstance(exc, SpecError) else f"the {self.executor.name} executor refused the attempt: {exc}"
        # The same request would be refused again: no retry.
        return self._fail_or_retry(job, outcome.Failure(ErrorType.SPEC, message, None, None), retry=False)

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

    def _paused(self, job: Job) -> str:
        """A sweep trial stopped by itself at its rung, checkpointed: back in line without spending a retry, held
        until its sweep promotes it (it resumes from that checkpoint) or stops it early (cancelled)."""
        unit, _, at = (self.pause_at or "steps:?").partition(":")
        words = f"paused at its rung ({unit} {at}); waits for its sweep's decision"
        return self._requeue(job, reason=f"{words}; resumes from its checkpoint", outcome_name="preempted",
                             consume_retry=False, exit_code=0, extra={"hold": words, "waiting_reason": words,
                                                                      "queue_position": None})

    def _record_attempt(self, job: Job, outcome_name: str, exit_code: int | None, error_type: str | None,
                        error_message: str | None = None) -> None:
        resumed = _resumed_from(self.tail.path)
        if resumed is None:
            resumed = self.resumed_step

        def record() -> None:
            # Only while this supervisor still holds the job: a stale one must not rewrite the reconciler's "lost".
            holds = sa.exists().where(Job.id == self.job_id, *self.lease.fence())
            self.session.exec(  # type: ignore[call-overload]
                sa.update(Attempt).where(Attempt.job_id == job.id, Attempt.attempt == job.attempt, holds)
                .values(finished_at=utcnow(), outcome=outcome_name, exit_code=exit_code, error_type=error_type,
                        error_message=error_message, resumed_from_step=resumed))
            self.session.commit()

        self.lease.db(record, "recording the attempt")
        mlflow_runs.settle(Path(job.run_dir or ""), outcome_name, self.settings.mlflow_tracking_uri)

    def _note_attempt(self, job: Job, note: str) -> None:
        """What the user should know about how this attempt started, on its record from the start."""

        def record() -> None:
            holds = sa.exists().where(Job.id == self.job_id, *self.lease.fence())
            self.session.exec(  # type: ignore[call-overload]
                sa.update(Attempt).where(Attempt.job_id == job.id, Attempt.attempt == job.attempt, holds).values(note=note))
            self.session.commit()

        self.lease.db(record, "noting the attempt")

    def _transition(self, to: Status, *, expect: list[Status], reason: str, values: dict[str, object] | None,
                    preempted: bool = False) -> Job:
        # What this attempt could not do for the job (event files it could not read) goes with how it ended.
        unreadable = self.found.tensorboard.unreadable
        reason = f"{reason}; {unreadable}" if unreadable else reason
        return self.lease.db(lambda: transition(self.session, self.job_id, to, expect=expect, reason=reason, values=values,
                                           guard=self.lease.fence(), preempted=preempted),
                        f"moving the job to {to.value}")

    def _finish(self, job: Job, to: Status, *, reason: str, outcome: str, exit_code: int | None = None) -> str:
        self._record_attempt(job, outcome, exit_code, None)
        if to == Status.SUCCEEDED:  # a success on a GPU wipes its device faults
            gpus = gpu_faults.blamed(job.placement or [], None)
            self.lease.db(lambda: gpu_faults.record_success(self.session, gpus), "clearing device faults")
        try:
            self._transition(to, expect=[Status.RUNNING, Status.CANCELLING], reason=reason,
                             values={"exit_code": exit_code} if exit_code is not None else None)
        except TransitionRefused as exc:
            log.warning("job %s: final transition refused (%s)", job.id, exc, extra=self.log_extra)
        return to.value

    def _requeue(self, job: Job, *, reason: str, outcome_name: str, consume_retry: bool,
                 exit_code: int | None, error: outcome.Failure | None = None, extra: dict[str, object] | None = None) -> str:
        self._record_attempt(job, outcome_name, exit_code, error.type.value if error else ErrorType.PREEMPTED.value,
                             error.message if error else reason)
        values: dict[str, object] = {
            "attempt": Job.attempt + 1, "worker_id": None, "lease_expires_at": None, "exit_code": exit_code, **(extra or {}),
        }
        if not consume_retry:
            values["max_attempts"] = Job.max_attempts + 1
        if error is not None:
            values.update(_error_values(error))
        try:
            # Stopped to make room (a preemption, a stopping host, the scheduler's reclaim): webhooks hear job.preempted.
            fresh = self._transition(Status.QUEUED, expect=[Status.RUNNING], reason=reason, values=values,
                                     preempted=outcome_name == "preempted")
        except TransitionRefused as exc:
            log.warning("job %s: requeue refused (%s)", job.id, exc, extra=self.log_extra)
            return "requeue refused"
        log.info("job %s: back in line at attempt %d; the scheduler places it again", fresh.id, fresh.attempt, extra=self.log_extra)
        return "requeued"

    def _device_fault(self, job: Job, error: outcome.Failure) -> tuple[outcome.Failure, str | None]:
        """Count a device fault in the failing rank's output against its GPU (jobs/gpu_faults.py). Returns the error
        (typed device_fault when it is one) and, the first time the job meets a fault on that GPU, the reason to put it
        back in line without spending a retry."""
        line = gpu_faults.device_fault(f"{error.message}\n{error.log_tail or ''}", gpu_faults.patterns(self.settings.gpu_fault_patterns))
        gpus = gpu_faults.blamed(job.placement or [], error.rank) if line else []
        if not line or not gpus:
            return error, None
        before = self.lease.db(lambda: gpu_faults.met_before(self.session, job.id, job.attempt, gpus), "reading earlier faults")
        self.lease.db(lambda: gpu_faults.record_fault(self.session, gpus, line, self.settings.gpu_fault_limit), "counting a device fault")
        where = ", ".join(f"{host} GPU {gpu}" for host, gpu in gpus)
        log.warning("job %s: device fault on %s: %s", job.id, where, line, extra=self.log_extra)
        error = dataclasses.replace(error, type=ErrorType.DEVICE_FAULT)
        return error, None if before else f"attempt {job.attempt} met a device fault on {where} ({line}); back in line"

    def _fail_or_retry(self, job: Job, error: outcome.Failure, retry: bool = True) -> str:
        if retry:
            error, free = self._device_fault(job, error)
            if free:
                return self._requeue(job, reason=free, outcome_name="failed", consume_retry=False, exit_code=error.exit_code, error=error)
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
        self._record_attempt(job, "failed", error.exit_code, error.type.value, error.message)
        try:
            self._transition(Status.FAILED, expect=[Status.RUNNING, Status.CANCELLING], reason=error.message[:500],
                             values=_error_values(error))
        except TransitionRefused as exc:
            log.warning("job %s: fail refused (%s)", job.id, exc, extra=self.log_extra)
        return Status.FAILED.value


    def _setup_ended(self, job: Job, exc: Exception) -> str:
        self.gang.stop_quietly()
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


