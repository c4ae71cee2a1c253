"""The local and Slurm executors against real torchrun and a real Slurm: what the supervisor will see.

Each test plays the supervisor's part by hand (write spec.json, start, poll, stop, release) and checks
what a user would notice: training ran and checkpointed, a stop let the ranks save, nothing is left
in squeue or in the process table, and Slurm's own ends (time limit, preemption, an administrator's
scancel, a failed node) are reported as such, with the verdict a local end of the same kind gets.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from jobs.store.models import ErrorType
from stack.slurm_cluster import SlurmCluster
from tests.chaos.conftest import faults, slow
from tests.executors.conftest import events, executor_settings, job_spec, phases, request, wait_ended, wait_step
from tests.helpers import wait_until
from worker import outcome
from worker.executors import make_executor
from worker.executors.base import EngineReason, Executor, Phase, engine_verdict
from worker.executors.local import LocalExecutor
from worker.executors.slurm import SlurmExecutor
from worker.sandbox.processes import marked_processes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rank_env")]


def _executor(kind: str, tmp_path: Path, request_: pytest.FixtureRequest) -> Executor:
    cluster = request_.getfixturevalue("slurm") if kind == "slurm" else None
    executor = make_executor(executor_settings(tmp_path, cluster))
    assert isinstance(executor, SlurmExecutor if kind == "slurm" else LocalExecutor)
    return executor


def _slow_ranks(monkeypatch: pytest.MonkeyPatch, attempt: int | None = None) -> None:
    """0.3 s after every step (of ``attempt``, or all), so a test has time to act mid-job."""
    for name, value in faults(slow(0.3, attempt=attempt)).items():
        monkeypatch.setenv(name, value)


def _job_id() -> str:
    return uuid.uuid4().hex[:16]


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return [e["step"] for e in events(run_dir) if e["type"] == "checkpoint"]


def _assert_nothing_left(executor: Executor, job_id: str, request_: pytest.FixtureRequest) -> None:
    if isinstance(executor, SlurmExecutor):
        cluster: SlurmCluster = request_.getfixturevalue("slurm")
        assert cluster.jobs() == []
    assert marked_processes(job_id) == []


@pytest.mark.slurm
def test_a_two_rank_job_runs_to_exit_0_through_slurm(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    executor = _executor("slurm", tmp_path, request)
    job_id = _job_id()
    launch = executor.start(req := request_for(executor, tmp_path, job_id, job_spec(steps=8)))
    assert launch.executor_id and launch.executor_id.isdigit()
    state = wait_ended(executor, launch)
    assert (state.phase, state.exit_code, state.reason) == (Phase.EXITED, 0, None), state
    assert phases(req.run_dir)[-1] == "done"
    assert _checkpoint_steps(req.run_dir)[-1] == 8
    assert (req.run_dir / "checkpoints" / "latest").exists()
    # torchrun's own output and every rank's log are where the local executor puts them.
    assert launch.launcher_log == req.log_dir / "launcher.log" and launch.launcher_log.exists()
    assert list(req.log_dir.glob("*/attempt_0/1/stdout.log")), sorted(p.name for p in req.log_dir.rglob("*"))
    executor.release(launch)
    _assert_nothing_left(executor, job_id, request)


@pytest.mark.parametrize("kind", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_stop_lets_the_ranks_checkpoint_and_leaves_nothing(kind: str, tmp_path: Path, request: pytest.FixtureRequest,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_ranks(monkeypatch)
    executor = _executor(kind, tmp_path, request)
    job_id = _job_id()
    req = request_for(executor, tmp_path, job_id, job_spec(steps=400))
    launch = executor.start(req)
    wait_step(req.run_dir, 2)
    assert executor.poll(launch).phase is Phase.RUNNING
    waits = []
    state = executor.stop(launch, grace_s=30, on_wait=lambda: waits.append(1))
    assert state.phase is Phase.EXITED and state.reason is None, state
    assert waits, "on_wait was never called during the grace period"
    # The trainer saved at the step it stopped on and said so: the supervisor requeues such an attempt.
    assert phases(req.run_dir)[-1] == "preempted"
    assert outcome.was_preempted(state.exit_code, "preempted")
    assert _checkpoint_steps(req.run_dir)[-1] >= 2
    _assert_nothing_left(executor, job_id, request)


@pytest.mark.slurm
def test_slurms_time_limit_is_reported_as_a_timeout(slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_ranks(monkeypatch)
    executor = SlurmExecutor(executor_settings(tmp_path, slurm))
    job_id = _job_id()
    req = request_for(executor, tmp_path, job_id, job_spec(steps=1000))
    launch = executor.start(req)
    wait_step(req.run_dir, 1)
    # An administrator shortens the limit to Slurm's smallest, a minute; Slurm enforces it.
    slurm.command("scontrol", "update", f"JobId={launch.executor_id}", "TimeLimit=1")
    state = wait_ended(executor, launch, timeout_s=180)
    assert state.reason is EngineReason.TIME_LIMIT, state
    verdict = engine_verdict(state)
    assert verdict is not None and verdict.error_type is ErrorType.TIMEOUT and not verdict.retry
    assert slurm.jobs() == []
    assert marked_processes(job_id) == []


@pytest.mark.slurm
def test_a_preempted_job_checkpoints_is_reported_and_the_next_attempt_resumes(slurm: SlurmCluster, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_ranks(monkeypatch, attempt=1)
    executor = SlurmExecutor(executor_settings(tmp_path, slurm))
    job_id, spec = _job_id(), job_spec(steps=24)
    first = executor.start(req := request_for(executor, tmp_path, job_id, spec))
    wait_step(req.run_dir, 5)
    # A job of a higher priority tier needs the whole node: Slurm preempts ours (GraceTime: SIGTERM first).
    urgent = slurm.command("sbatch", "--parsable", "--partition=urgent", "--cpus-per-task=2", "--output=/dev/null",
                            "--wrap", "sleep 2").strip()
    state = wait_ended(executor, first, timeout_s=120)
    assert state.reason is EngineReason.PREEMPTED, state
    assert phases(req.run_dir)[-1] == "preempted"  # the ranks saved; torchrun itself exits 1 on SIGTERM
    saved = _checkpoint_steps(req.run_dir)[-1]
    assert saved >= 5
    verdict = engine_verdict(state)
    assert verdict is not None and not verdict.retry and verdict.error_type is ErrorType.PREEMPTED  # requeued: no retry spent
    wait_until(lambda: urgent not in slurm.jobs(), 60, what="the urgent job to finish")

    # The supervisor's requeue: attempt 2 is a new Slurm job on the same run directory.
    second = executor.start(request_for(executor, tmp_path, job_id, spec, attempt=2))
    assert second.executor_id != first.executor_id
    state = wait_ended(executor, second)
    assert (state.phase, state.exit_code, state.reason) == (Phase.EXITED, 0, None), state
    resumed = [e.get("resumed_from_step") for e in events(req.run_dir) if e["type"] == "status" and e["phase"] == "training"]
    assert resumed == [0, saved]
    assert phases(req.run_dir)[-1] == "done"
    assert slurm.jobs() == []


@pytest.mark.slurm
def test_an_administrators_scancel_and_a_failed_node_are_reported(slurm: SlurmCluster, tmp_path: Path) -> None:
    executor = SlurmExecutor(executor_settings(tmp_path, slurm))
    ends = {}
    for what in ("scancel", "node"):
        job_id = _job_id()
        launch = executor.start(request_for(executor, tmp_path, job_id, job_spec(steps=400)))
        wait_until(lambda launch=launch: executor.poll(launch).phase is Phase.RUNNING, 60, what="RUNNING")
        if what == "scancel":
            slurm.command("scancel", str(launch.executor_id))
        else:
            slurm.command("scontrol", "update", f"NodeName={slurm.node}", "State=DOWN", "Reason=torchyard-test")
        ends[what] = wait_ended(executor, launch, timeout_s=90)
        if what == "node":
            # ReturnToService=2 may have put it back already, once its slurmd registered again.
            slurm.command("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME", check=False)
        wait_until(lambda job_id=job_id: not marked_processes(job_id), 30, what="the ranks to be gone")
    assert ends["scancel"].reason is EngineReason.CANCELLED, ends
    assert ends["node"].reason is EngineReason.NODE_FAILURE, ends
    cancelled, lost = engine_verdict(ends["scancel"]), engine_verdict(ends["node"])
    assert cancelled is not None and cancelled.error_type is ErrorType.CANCELLED_BY_ENGINE and not cancelled.retry
    assert lost is not None and lost.error_type is ErrorType.WORKER_LOST and not lost.retry  # requeued: no retry spent
    wait_until(slurm._idle, 60, what="the node to be idle again")


@pytest.mark.slurm
def test_a_request_slurm_can_never_meet_is_reported_unschedulable(slurm: SlurmCluster, tmp_path: Path) -> None:
    executor = SlurmExecutor(executor_settings(tmp_path, slurm))
    launch = executor.start(request_for(executor, tmp_path, _job_id(), job_spec(steps=4, nproc=4)))  # 4 CPUs, a 2-CPU node
    state = wait_until(lambda: (s := executor.poll(launch)).reason and s, 60, what="Slurm's pending reason")
    assert (state.phase, state.reason) == (Phase.PENDING, EngineReason.UNSCHEDULABLE), state
    assert "PartitionConfig" in state.detail
    verdict = engine_verdict(state)
    assert verdict is not None and verdict.error_type is ErrorType.SPEC and not verdict.retry
    executor.stop(launch, grace_s=5)
    assert slurm.jobs() == []


def request_for(executor: Executor, tmp_path: Path, job_id: str, spec: dict, attempt: int = 1):  # noqa: ANN201
    return request(executor.settings, job_id, spec, attempt)  # type: ignore[attr-defined]
