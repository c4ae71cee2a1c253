"""What an ended attempt makes of its job: the judge, a pure function.

The supervisor (worker/supervisor.py) says why the attempt stopped (a ``Stop``) and what else the verdict depends on
(``Facts``: the job's attempts and retries, its lost workers, its GPUs' earlier faults); ``judge`` returns the
``Verdict``: the job's next status, the attempt's outcome, whether a retry is spent, and the error. The supervisor
records it (worker/verdict_record.py). Nothing here reads or writes anything, so every rule is a property test
(tests/worker/test_verdict_properties.py).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs.hosts import gpu_faults
from jobs.hosts.placement import node_label
from jobs.store.models import ErrorType, Status
from jobs.store.states import cancelled, loss_forgiven
from jobspec.exit_codes import PAUSED_PHASE
from worker import oom
from worker.executors.base import Phase, RankState, engine_verdict
from worker.outcome import Failure, was_preempted


class Why(str, enum.Enum):
    """Why an attempt stopped, as its supervisor saw it."""

    EXITED = "exited"  # the ranks ended by themselves: Stop.state and exit_code say how
    CANCEL = "cancel"  # the user cancelled the job (it reads cancelling)
    HOST_STOPPING = "host_stopping"  # the worker was told to stop (SIGTERM: docker stop, a node drain)
    MAKE_ROOM = "make_room"  # the scheduler wants the job's devices (Stop.detail: its words)
    TIMEOUT = "timeout"  # ran past timeout_s (Stop.detail: the words)
    STALLED = "stalled"  # no progress from rank 0 for stall_timeout_s (Stop.detail: the words)
    BAD_EVENT = "bad_event"  # the trainer wrote an event the service cannot store (Stop.detail: the words)
    UNSCHEDULABLE = "unschedulable"  # still pending, and the engine says it can never run as asked (Stop.state)
    REFUSED = "refused"  # could not start as asked: spec, owner, setup, disk, engine (Stop.failure); another attempt would fail alike
    NO_FREE_UID = "no_free_uid"  # the worker had no uid free for the ranks (Stop.failure)
    ENGINE_UNREACHABLE = "engine_unreachable"  # the engine's controller did not answer the launch (Stop.detail)
    WATCHDOG = "watchdog"  # the lease went unrenewed and its watchdog stopped the ranks (Stop.detail)
    OWNERSHIP_LOST = "ownership_lost"  # the job is no longer this attempt's (lease refused, a fenced write)
    DATABASE_UNREACHABLE = "database_unreachable"  # unreachable until the lease could lapse: ownership given up


@dataclass(frozen=True)
class Stop:
    """Why an attempt stopped, with what was seen: the watch's value (or a step's before it, ``preparing``)."""

    why: Why
    exit_code: int | None = None  # the ranks' (torchrun's) code once they ended or were stopped
    state: RankState | None = None  # EXITED, UNSCHEDULABLE: the executor's last word on the ranks
    detail: str = ""  # what was seen, in words; EXITED cleanly: a warning for the success's reason
    failure: Failure | None = None  # REFUSED, NO_FREE_UID; EXITED otherwise: what the ranks' error files say
    log_tail: str = ""  # the launcher's last lines, for an end the engine explains
    lost_nodes: tuple[tuple[int, str], ...] = ()  # EXITED: other nodes (rank, host) whose host died
    preparing: bool = False  # stopped while the job's environment was built, before any rank started

    @property
    def ours(self) -> bool:
        """False once the job is no longer this attempt's: nothing more may be written for it."""
        return self.why not in (Why.OWNERSHIP_LOST, Why.DATABASE_UNREACHABLE)


@dataclass(frozen=True)
class Facts:
    """The job as the attempt ends, beyond why it stopped."""

    attempt: int
    max_attempts: int
    last_phase: str | None = None  # the trainer's last status event
    nnodes: int = 1
    earlier_losses: int = 0  # the job's attempts before this one that lost their worker (jobs.store.states.worker_losses)
    max_worker_losses: int = 3
    placement: Sequence[Mapping[str, Any]] = ()
    faulted_before: frozenset[tuple[str, int]] = frozenset()  # (host, GPU) an earlier attempt met a device fault on
    fault_patterns: Sequence[re.Pattern[str]] = ()  # jobs.hosts.gpu_faults.patterns()
    spec: Mapping[str, Any] = field(default_factory=dict)  # the stored spec, for an OOM's smaller micro-batch
    ranks: int = 1
    adjustments: Sequence[Mapping[str, Any]] = ()  # the job's earlier automatic spec changes
    pause_at: str | None = None  # a sweep trial's rung ("steps:N")
    cancelled_by: str = "user"  # who asked for a cancel (jobs.store.states.cancelled_by)


@dataclass(frozen=True)
class DeviceFault:
    line: str  # the output's line that names it
    gpus: tuple[tuple[str, int], ...]  # (host, GPU) it counts against


@dataclass(frozen=True)
class Verdict:
    """``status`` None: the job is no longer this attempt's, and ``reason`` is all there is to say."""

    status: Status | None
    outcome: str | None  # the attempt's record: succeeded, failed, cancelled, preempted, lost
    reason: str
    spends_retry: bool = False  # back in line (queued) spending one of the job's retries
    error: Failure | None = None
    exit_code: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)  # further columns of the job: a hold, a new spec
    fault: DeviceFault | None = None  # to count against its GPUs (jobs/hosts/gpu_faults.py)


def judge(stop: Stop, facts: Facts) -> Verdict:
    """The verdict on an attempt that stopped for ``stop``."""
    why, code = stop.why, stop.exit_code
    if not stop.ours:
        return Verdict(None, None, "lost ownership (database unreachable)" if why is Why.DATABASE_UNREACHABLE
                       else "lost ownership")
    if why is Why.CANCEL:
        return Verdict(Status.CANCELLED, "cancelled", cancelled(facts.cancelled_by))
    if why is Why.HOST_STOPPING:
        return _preempted("worker stopped (preempted) while preparing the job" if stop.preparing
                          else "worker stopped (preempted); resumes from its checkpoint", code)
    if why is Why.MAKE_ROOM:
        return _make_room(stop, facts)
    if why is Why.WATCHDOG:
        # Not the training's fault: like a lost worker, requeued without spending a retry.
        return _requeued(f"{stop.detail}; requeued", "lost", code, Failure(ErrorType.WORKER_LOST, stop.detail, None, code))
    if why is Why.BAD_EVENT:  # the same code would write it again
        return _failed(Failure(ErrorType.BAD_EVENT, stop.detail, None, code), facts, retry=False)
    if why is Why.TIMEOUT:  # a longer run would hit it again
        return _failed(Failure(ErrorType.TIMEOUT, stop.detail, None, code), facts, retry=False)
    if why is Why.STALLED:
        return _failed(Failure(ErrorType.STALLED, stop.detail, None, code), facts)
    if why in (Why.REFUSED, Why.NO_FREE_UID):
        assert stop.failure is not None
        return _failed(stop.failure, facts, retry=why is Why.NO_FREE_UID)
    if why is Why.ENGINE_UNREACHABLE:  # not the job's fault: as a lost worker
        return _lost(stop.detail, None, facts)
    if why is Why.UNSCHEDULABLE:
        return _engine_ended(stop, facts)
    return _exited(stop, facts)


def _exited(stop: Stop, facts: Facts) -> Verdict:
    """The ranks ended by themselves."""
    state, code = stop.state, stop.exit_code
    assert state is not None
    if code == 0 and state.reason is None:
        if facts.last_phase == PAUSED_PHASE:
            return _paused(facts)
        return _succeeded("torchrun exited 0" + (f"; {stop.detail}" if stop.detail else ""))
    if state.reason is not None or state.phase is Phase.GONE:
        return _engine_ended(stop, facts)
    if was_preempted(code, facts.last_phase):
        return _preempted("preempted; resumes from its checkpoint", code)
    if facts.nnodes > 1 and not stop.lost_nodes and facts.last_phase == "done":
        return _done_despite(f"node 0's torchrun exited with code {code}")
    if stop.lost_nodes:
        # Node 0's ranks failed because a peer node vanished: the node's loss is the cause, not the training.
        return _lost(", ".join(node_label(r, h) for r, h in stop.lost_nodes) + " lost", code, facts)
    assert stop.failure is not None
    return _failed(stop.failure, facts)


def _engine_ended(stop: Stop, facts: Facts) -> Verdict:
    """An end the engine explains: the verdict the same end gets on a local worker (executors/base.py)."""
    state = stop.state
    assert state is not None
    verdict = engine_verdict(state)
    if verdict is None:  # gone without a word: the engine lost the attempt, as a vanished worker
        if facts.last_phase == "done":
            return _done_despite(state.detail or "the attempt vanished from the executor")
        return _lost(state.detail or "the executor lost the attempt", state.exit_code, facts)
    if verdict.error_type is ErrorType.WORKER_LOST:
        return _lost(verdict.message, state.exit_code, facts)
    if verdict.error_type is ErrorType.PREEMPTED:
        return _preempted(verdict.message, state.exit_code)
    return _failed(Failure(verdict.error_type, verdict.message, None, state.exit_code, stop.log_tail or None), facts,
                   retry=verdict.retry)


def _make_room(stop: Stop, facts: Facts) -> Verdict:
    """Stopped with the grace to checkpoint for the scheduler (a preemption, a sweep pausing a trial): back in line
    without spending a retry; the next attempt resumes from that checkpoint."""
    why = stop.detail
    if stop.exit_code == 0 and facts.last_phase == "done":  # it finished within the grace: nothing left to resume
        return _succeeded(f"training done while stopping ({why})")
    if stop.preparing:
        return _preempted(f"{why} (while preparing the job)", None, {"waiting_reason": why})
    return _preempted(f"{why}; resumes from its checkpoint", stop.exit_code, {"waiting_reason": why, "queue_position": None})


def _paused(facts: Facts) -> Verdict:
    """A sweep trial stopped by itself at its rung, checkpointed: back in line without spending a retry, held
    until its sweep promotes it (it resumes from that checkpoint) or stops it early (cancelled)."""
    unit, _, at = (facts.pause_at or "steps:?").partition(":")
    words = f"paused at its rung ({unit} {at}); waits for its sweep's decision"
    return _preempted(f"{words}; resumes from its checkpoint", 0, {"hold": words, "waiting_reason": words, "queue_position": None})


def _done_despite(what: str) -> Verdict:
    """Training finished: the trainer's "done" comes after the last step and the final checkpoint, both
    collective, so every rank got there. A rank that crashes after that, while tearing down (seen on
    CPU: a gloo rank aborting at interpreter exit once its peers on another node are gone), loses nothing."""
    return _succeeded(f"training done; {what} while shutting down")


def _lost(what: str, code: int | None, facts: Facts) -> Verdict:
    """A worker, a node or the engine's hold on the attempt vanished: requeued without spending a retry, up to the
    job's limit of lost workers (jobs.store.states.loss_forgiven)."""
    if loss_forgiven(facts.earlier_losses, facts.max_worker_losses):
        return _requeued(f"{what}; requeued", "lost", code, Failure(ErrorType.WORKER_LOST, what, None, code))
    error = Failure(ErrorType.WORKER_LOST, f"{what}; {facts.max_worker_losses} workers lost already", None, code)
    return _failed(error, facts, retry=False)


def _failed(error: Failure, facts: Facts, retry: bool = True) -> Verdict:
    """A failure: back in line while retries are left (``retry``: another attempt could fare better), else failed.
    A device fault met the first time on its GPU, and an OOM the job asked to recover from, spend no retry."""
    fault = _device_fault(error, facts) if retry else None
    if fault is not None:
        error = dataclasses.replace(error, type=ErrorType.DEVICE_FAULT)
        if not facts.faulted_before & set(fault.gpus):
            where = ", ".join(f"{host} GPU {gpu}" for host, gpu in fault.gpus)
            free = f"attempt {facts.attempt} met a device fault on {where} ({fault.line}); back in line"
            return _requeued(free, "failed", error.exit_code, error, fault=fault)
    if retry and error.type == ErrorType.OOM:
        halved = oom.halved_micro_batch(dict(facts.spec), facts.attempt, facts.ranks)
        if halved is not None:
            # The remedy is the change itself, so it spends no retry; halvings are bounded by the micro-batch.
            adjusted, change = halved
            reason = (f"attempt {facts.attempt} ran out of memory; retrying with micro-batch "
                      f"{change['micro_batch']['to']} x grad_accum_steps {change['to']}")
            return _requeued(reason, "failed", error.exit_code, error, fault=fault,
                             values={"spec": adjusted, "adjustments": [*facts.adjustments, change]})
    if retry and facts.attempt < facts.max_attempts:
        return _requeued(f"attempt {facts.attempt} failed ({error.type.value}); retrying", "failed", error.exit_code,
                         error, spends_retry=True, fault=fault)
    return Verdict(Status.FAILED, "failed", error.message[:500], error=error, exit_code=error.exit_code, fault=fault)


def _device_fault(error: Failure, facts: Facts) -> DeviceFault | None:
    """A device fault in the failing rank's output, and the GPUs it counts against (jobs/hosts/gpu_faults.py)."""
    line = gpu_faults.device_fault(f"{error.message}\n{error.log_tail or ''}", facts.fault_patterns)
    gpus = gpu_faults.blamed(facts.placement, error.rank) if line else []
    return DeviceFault(line, tuple(gpus)) if line and gpus else None


def _succeeded(reason: str) -> Verdict:
    return Verdict(Status.SUCCEEDED, "succeeded", reason, exit_code=0)


def _preempted(reason: str, code: int | None, values: Mapping[str, Any] | None = None) -> Verdict:
    """Stopped to make room (a preemption, a stopping host, the scheduler's reclaim): back in line, no retry spent."""
    return _requeued(reason, "preempted", code, None, values=values)


def _requeued(reason: str, outcome: str, code: int | None, error: Failure | None, *, spends_retry: bool = False,
              fault: DeviceFault | None = None, values: Mapping[str, Any] | None = None) -> Verdict:
    return Verdict(Status.QUEUED, outcome, reason, spends_retry=spends_retry, error=error, exit_code=code,
                   values=dict(values or {}), fault=fault)
