"""The executor contract: how an attempt's ranks are started, watched and stopped (docs/executors.md).

The supervisor owns an attempt's lifecycle: the claim, the lease, ingesting events.jsonl, every stop
decision (cancel, timeout, stall, preemption, lost ownership) and the final status. An executor owns
only the ranks: it starts them, says whether they still run (and, when they ended, with which code
and what the engine says about why), and stops them: a graceful signal, a grace period, then hard.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from jobs.store.models import ErrorType
from jobspec.spec import AnySpec
from worker.launch import NodeLaunch
from worker.sandbox.job_users import JobIdentity

# Node 0's torchrun output, under logs/attempt-<k>/ of the run directory (node k > 0: launcher-node-<k>.log).
LAUNCHER_LOG = "launcher.log"


class LaunchError(RuntimeError):
    """The engine refused the attempt. ``transient``: it may take it later (its controller was
    unreachable); otherwise the request itself cannot be met (no such partition, too many GPUs)."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


class Phase(str, enum.Enum):
    PENDING = "pending"  # accepted by the engine, not running yet (e.g. waiting in Slurm's queue)
    RUNNING = "running"
    EXITED = "exited"  # ended; ``exit_code`` is torchrun's (a signal as -N) when the engine knows it
    GONE = "gone"  # the engine no longer knows the attempt and left no exit code


class EngineReason(str, enum.Enum):
    """Why the engine ended the ranks, beyond their own exit code."""

    NODE_FAILURE = "node_failure"
    TIME_LIMIT = "time_limit"
    CANCELLED = "cancelled"  # by someone other than this executor (an administrator's scancel)
    PREEMPTED = "preempted"  # a higher-priority job took the nodes; the ranks had the grace to checkpoint
    OUT_OF_MEMORY = "out_of_memory"  # the engine's memory limit (cgroup), not a CUDA OOM
    UNSCHEDULABLE = "unschedulable"  # still pending, and the engine says it can never run as asked


@dataclass(frozen=True)
class RankState:
    phase: Phase
    exit_code: int | None = None
    reason: EngineReason | None = None
    detail: str = ""  # the engine's own words, for the attempt's error message

    @property
    def ended(self) -> bool:
        return self.phase in (Phase.EXITED, Phase.GONE)


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt to start. ``node`` is set on a node of a multi-node job (local executor only); ``gpus`` are the
    physical GPUs the placement gave this node (None: the executor's engine places the ranks, as Slurm does)."""

    job_id: str
    attempt: int
    run_dir: Path
    spec: AnySpec
    resume_from: str | None = None
    node: NodeLaunch | None = None
    # The job's decrypted secrets (jobs/infra/secrets.py), for the ranks' environment only; never logged or written.
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    # The uid (and cgroup) the ranks run as (worker/sandbox/job_users.py); None: the worker's own user.
    identity: JobIdentity | None = None
    # The placement's physical GPU indices on this host (CUDA_VISIBLE_DEVICES); None: not placed on GPUs.
    gpus: tuple[int, ...] | None = None
    # The job's owner: whose compile caches the ranks use (worker/compile_cache.py).
    owner: str = ""
    # A sweep trial's stop ("steps:N", "epochs:N"; jobspec.exit_codes.PAUSE_AT_ENV); None: it trains to the end.
    pause_at: str | None = None

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs" / f"attempt-{self.attempt}"


@dataclass
class Launch:
    """A started attempt, as the executor that started it tracks it."""

    request: LaunchRequest
    # What the engine calls it (the Slurm job id); recorded in the job and its attempt. None: local.
    executor_id: str | None
    launcher_log: Path  # node 0's torchrun output: where the supervisor looks for the root cause


class Executor(Protocol):
    name: str
    # True: the engine places every node of a multi-node job itself, so no other host starts a node of it.
    allocates_nodes: bool

    def start(self, request: LaunchRequest) -> Launch:
        """Start the attempt's ranks. Raises SpecError (the script no longer resolves) or LaunchError."""
        ...

    def poll(self, launch: Launch) -> RankState:
        """Where the ranks are now; cheap enough to call every supervisor loop."""
        ...

    def stop(self, launch: Launch, grace_s: float, on_wait: Callable[[], None] | None = None) -> RankState:
        """SIGTERM the ranks (they checkpoint and exit), wait up to ``grace_s`` calling ``on_wait``
        (ingest, heartbeat), then end whatever is left. Returns the final state."""
        ...

    def kill(self, launch: Launch) -> None:
        """End every rank of the attempt now, without a grace period; safe to call from another thread
        (the supervisor's lease watchdog, while the main thread may hang in a database call)."""
        ...

    def release(self, launch: Launch) -> None:
        """After the ranks ended by themselves: end what they left (orphaned data-loader workers,
        an allocation still completing), so nothing of the attempt outlives it."""
        ...

    def attach(self, request: LaunchRequest, executor_id: str) -> Launch:
        """The launch of an attempt started earlier, perhaps by a worker that is gone, by the id it
        recorded: a later attempt stops what an earlier one left running. Raises LaunchError where
        the engine cannot find attempts by id (local: their processes died with their worker)."""
        ...


@dataclass(frozen=True)
class EngineVerdict:
    """What the supervisor does with an attempt the engine ended: fail with ``error_type``, and ``retry``
    (spend one of the job's retries) or not. A lost node or a preemption gets a new attempt without
    spending one, as on a local worker: the supervisor reads that from ``error_type``."""

    error_type: ErrorType
    retry: bool
    message: str


# (error type, retry, message) of each engine-side end, as the same end on a local worker gets it.
_VERDICTS: dict[EngineReason, tuple[ErrorType, bool, str]] = {
    # Like the supervisor's own timeout_s: a longer run would hit it again.
    EngineReason.TIME_LIMIT: (ErrorType.TIMEOUT, False, "timeout: the engine's time limit"),
    # Like a lost worker: not the training's fault; a new attempt resumes elsewhere.
    EngineReason.NODE_FAILURE: (ErrorType.WORKER_LOST, False, "a node of the attempt failed"),
    EngineReason.PREEMPTED: (ErrorType.PREEMPTED, False, "preempted by the engine; resumes from its checkpoint"),
    EngineReason.OUT_OF_MEMORY: (ErrorType.OOM, True, "out of host memory"),
    # Asked for more than the cluster has (CPUs, GPUs, nodes, time): only a changed spec can run.
    EngineReason.UNSCHEDULABLE: (ErrorType.SPEC, False, "the engine can never run it as asked"),
    # Someone with power over the cluster wanted it gone: retrying would fight them.
    EngineReason.CANCELLED: (ErrorType.CANCELLED_BY_ENGINE, False, "cancelled in the engine, not through torchyard"),
}


def engine_verdict(state: RankState) -> EngineVerdict | None:
    """The verdict for an engine-side end; None when the engine gave no reason and the exit code
    decides, as for a local attempt (outcome.failure, was_preempted)."""
    if state.reason is None:
        return None
    error_type, retry, message = _VERDICTS[state.reason]
    detail = f" ({state.detail})" if state.detail else ""
    return EngineVerdict(error_type, retry=retry, message=message + detail)
