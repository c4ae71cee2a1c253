"""The verdict on an ended attempt (worker.verdicts.judge) over random stops and jobs: a cancel always ends cancelled, a
preemption never spends a retry, a lost worker is forgiven up to the job's limit and fails it after, a failure retries
while retries are left, a clean exit succeeds, and the next status is always one the state machine allows from
running."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs.hosts import gpu_faults
from jobs.store.models import ErrorType, Status
from jobs.store.states import ALLOWED
from jobspec.exit_codes import PAUSED_PHASE, PREEMPTED_EXIT_CODE
from tests.quick_examples import examples
from worker.executors.base import EngineReason, Phase, RankState
from worker.outcome import Failure
from worker.verdicts import Facts, Stop, Verdict, Why, judge

SETTINGS = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

PATTERNS = tuple(gpu_faults.patterns())
HOSTS = ("h0", "h1", "h2")
AUTO_MICRO_BATCH = {"kind": "catalog", "train": {"auto_micro_batch": True, "global_batch_size": 64, "grad_accum_steps": 1}}
PHASES = (None, "starting", "training", "done", "preempted", PAUSED_PHASE)

codes = st.one_of(st.none(), st.sampled_from([0, 1, 2, -9, -15, PREEMPTED_EXIT_CODE]), st.integers(-64, 255))
words = st.sampled_from(["", "boom", "CUDA error: uncorrectable ECC error encountered", "NCCL WARN ncclSystemError",
                         "torch.OutOfMemoryError: CUDA out of memory", "Xid 79: GPU has fallen off the bus"])


@st.composite
def failures(draw: st.DrawFn) -> Failure:
    return Failure(draw(st.sampled_from(list(ErrorType))), draw(words) or "failed", draw(st.none() | st.just("Traceback")),
                   draw(codes), draw(st.none() | words), draw(st.none() | st.integers(0, 7)))


@st.composite
def rank_states(draw: st.DrawFn, ended: bool = True) -> RankState:
    phase = draw(st.sampled_from([Phase.EXITED, Phase.GONE] if ended else [Phase.PENDING]))
    reason = draw(st.none() | st.sampled_from(list(EngineReason))) if ended else draw(st.sampled_from(list(EngineReason)))
    return RankState(phase, None if phase is Phase.GONE else draw(codes), reason, draw(st.sampled_from(["", "node n3"])))


@st.composite
def stops(draw: st.DrawFn, why: Why | None = None) -> Stop:
    """Stops as the supervisor makes them: each carries what its kind says it carries."""
    why = why or draw(st.sampled_from(list(Why)) | st.just(Why.EXITED))  # half of them: the ranks ended by themselves
    code = draw(codes)
    if why is Why.EXITED:
        state = draw(rank_states())
        code = state.exit_code
        clean = code == 0 and state.reason is None
        return Stop(why, exit_code=code, state=state, detail="" if not clean else draw(st.sampled_from(["", "rank 1 alone"])),
                    failure=None if clean else draw(failures()), log_tail=draw(words),
                    lost_nodes=() if code == 0 else tuple(draw(st.lists(st.tuples(st.integers(1, 3), st.sampled_from(HOSTS)),
                                                                        max_size=2))))
    if why is Why.UNSCHEDULABLE:
        state = draw(rank_states(ended=False))
        return Stop(why, exit_code=code, state=state, log_tail=draw(words))
    failure = draw(failures()) if why in (Why.REFUSED, Why.NO_FREE_UID) else None
    preparing = draw(st.booleans()) if why in (Why.CANCEL, Why.HOST_STOPPING, Why.MAKE_ROOM, Why.OWNERSHIP_LOST) else False
    return Stop(why, exit_code=None if preparing else code, detail=draw(words) or "why", failure=failure, preparing=preparing)


@st.composite
def placements(draw: st.DrawFn) -> list[dict[str, Any]]:
    return [{"node_rank": i, "host": host, "gpus": draw(st.lists(st.integers(0, 3), max_size=4, unique=True))}
            for i, host in enumerate(HOSTS[:draw(st.integers(0, 3))])]


@st.composite
def facts(draw: st.DrawFn) -> Facts:
    placement = draw(placements())
    gpus = [(n["host"], g) for n in placement for g in n["gpus"]]
    return Facts(
        attempt=draw(st.integers(1, 6)), max_attempts=draw(st.integers(1, 6)), last_phase=draw(st.sampled_from(PHASES)),
        nnodes=draw(st.integers(1, 3)), earlier_losses=draw(st.integers(0, 5)), max_worker_losses=draw(st.integers(0, 4)),
        placement=placement, faulted_before=frozenset(draw(st.sets(st.sampled_from(gpus)))) if gpus else frozenset(),
        fault_patterns=PATTERNS, spec=draw(st.sampled_from([{}, AUTO_MICRO_BATCH])), ranks=draw(st.sampled_from([1, 2, 4, 64])),
        pause_at=draw(st.none() | st.just("steps:10")), cancelled_by=draw(st.sampled_from(["user", "admin"])),
    )


@SETTINGS
@given(stops(), facts())
def test_every_verdict_is_a_move_the_state_machine_allows_from_running(stop: Stop, job: Facts) -> None:
    verdict = judge(stop, job)
    event(f"{stop.why.value} -> {verdict.status.value if verdict.status else None}")
    assert verdict == judge(stop, job), "the same stop and job judged twice differently"
    if verdict.status is None:
        assert not stop.ours and verdict.outcome is None, "only an attempt that lost its job writes nothing"
        return
    assert stop.ours
    assert verdict.status in ALLOWED[Status.RUNNING]
    assert verdict.outcome in {"succeeded", "failed", "cancelled", "preempted", "lost"}
    assert not verdict.spends_retry or verdict.status is Status.QUEUED, "only a retry spends a retry"
    if verdict.status is Status.FAILED:
        assert verdict.error is not None and verdict.reason == verdict.error.message[:500]
    if verdict.status in (Status.SUCCEEDED, Status.CANCELLED):
        assert verdict.error is None
    if verdict.outcome == "lost":
        assert verdict.status is Status.QUEUED and not verdict.spends_retry
        assert verdict.error is not None and verdict.error.type is ErrorType.WORKER_LOST


@SETTINGS
@given(st.data(), facts())
def test_a_cancel_always_ends_cancelled(data: st.DataObject, job: Facts) -> None:
    verdict = judge(data.draw(stops(Why.CANCEL)), job)
    assert (verdict.status, verdict.outcome, verdict.reason) == (Status.CANCELLED, "cancelled", f"cancelled by {job.cancelled_by}")


@SETTINGS
@given(stops(), facts())
def test_a_preemption_never_spends_a_retry(stop: Stop, job: Facts) -> None:
    verdict = judge(stop, job)
    if verdict.outcome == "preempted":
        assert verdict.status is Status.QUEUED and not verdict.spends_retry and verdict.error is None
    if stop.why is Why.HOST_STOPPING:
        assert verdict.outcome == "preempted"
    if stop.why is Why.MAKE_ROOM:
        # Only an attempt that finished its training within the grace is not put back in line.
        finished = stop.exit_code == 0 and job.last_phase == "done"
        assert verdict.outcome == ("succeeded" if finished else "preempted")
        if not finished:
            assert verdict.values["waiting_reason"] == stop.detail


@SETTINGS
@given(st.data(), facts())
def test_a_lost_worker_is_forgiven_within_the_limit_and_fails_the_job_beyond_it(data: st.DataObject, job: Facts) -> None:
    lost = data.draw(st.sampled_from([
        Stop(Why.ENGINE_UNREACHABLE, detail="the slurm executor could not start the attempt: timed out"),
        Stop(Why.EXITED, exit_code=None, state=RankState(Phase.EXITED, None, EngineReason.NODE_FAILURE)),
        Stop(Why.EXITED, exit_code=1, state=RankState(Phase.EXITED, 1), failure=Failure(ErrorType.TRAINING, "x", None, 1),
             lost_nodes=((1, "h1"),)),
    ]))
    if lost.lost_nodes and job.last_phase == "preempted":
        return  # a checkpointed preemption is judged as one, whatever else was lost
    verdict = judge(lost, job)
    if job.earlier_losses < job.max_worker_losses:
        assert (verdict.status, verdict.outcome, verdict.spends_retry) == (Status.QUEUED, "lost", False)
    else:
        assert verdict.status is Status.FAILED
        assert verdict.error is not None and verdict.error.type is ErrorType.WORKER_LOST
        assert verdict.error.message.endswith(f"{job.max_worker_losses} workers lost already")


@SETTINGS
@given(st.integers(0, 6), st.integers(1, 3))
def test_the_first_max_worker_losses_losses_are_requeued_and_the_next_fails(limit: int, max_attempts: int) -> None:
    """A job whose every attempt loses its worker: requeued exactly ``limit`` times, then failed, its retries untouched."""
    losses, attempt = 0, 1
    while True:
        verdict = judge(Stop(Why.ENGINE_UNREACHABLE, detail="lost"),
                        Facts(attempt=attempt, max_attempts=max_attempts + losses, earlier_losses=losses, max_worker_losses=limit))
        if verdict.status is not Status.QUEUED:
            break
        assert not verdict.spends_retry
        losses, attempt = losses + 1, attempt + 1
    assert (losses, verdict.status) == (limit, Status.FAILED)


def _plain(failure: Failure) -> bool:
    """Neither a device fault nor an out-of-memory error: nothing spares its retry."""
    return failure.type is not ErrorType.OOM and gpu_faults.device_fault(f"{failure.message}\n{failure.log_tail or ''}",
                                                                         PATTERNS) is None


@SETTINGS
@given(stops(), facts())
def test_a_failure_retries_while_retries_are_left_and_fails_after(stop: Stop, job: Facts) -> None:
    verdict = judge(stop, job)
    if stop.why in (Why.TIMEOUT, Why.BAD_EVENT, Why.REFUSED):
        # Another attempt would fail the same way.
        assert verdict.status is Status.FAILED and verdict.outcome == "failed"
    retriable = stop.why in (Why.STALLED, Why.NO_FREE_UID) or (
        stop.why is Why.EXITED and stop.state is not None and stop.state.reason is None and stop.state.phase is Phase.EXITED
        and stop.exit_code not in (0, PREEMPTED_EXIT_CODE) and job.last_phase not in ("preempted", "done")
        and not stop.lost_nodes)
    if retriable:
        failure = stop.failure or Failure(ErrorType.STALLED, stop.detail, None, stop.exit_code)
        if not _plain(failure):
            return
        event("retries left" if job.attempt < job.max_attempts else "no retry left")
        if job.attempt < job.max_attempts:
            assert (verdict.status, verdict.outcome, verdict.spends_retry) == (Status.QUEUED, "failed", True)
        else:
            assert verdict.status is Status.FAILED
        assert verdict.error is not None and verdict.error.message == failure.message


@SETTINGS
@given(facts(), st.sampled_from(["", "rank 1 joined a process group of 1"]))
def test_exit_0_of_every_rank_after_training_finished_succeeds(job: Facts, warning: str) -> None:
    stop = Stop(Why.EXITED, exit_code=0, state=RankState(Phase.EXITED, 0), detail=warning)
    verdict = judge(stop, job)
    if job.last_phase == PAUSED_PHASE:  # a sweep trial that stopped at its rung waits for its sweep
        assert (verdict.status, verdict.outcome, verdict.spends_retry) == (Status.QUEUED, "preempted", False)
        assert "hold" in verdict.values
        return
    assert (verdict.status, verdict.outcome, verdict.exit_code) == (Status.SUCCEEDED, "succeeded", 0)
    assert verdict.reason.startswith("torchrun exited 0") and warning in verdict.reason


@SETTINGS
@given(facts(), st.integers(0, 7))
def test_a_device_fault_spends_no_retry_the_first_time_on_its_gpu(job: Facts, rank: int) -> None:
    failure = Failure(ErrorType.TRAINING, f"rank {rank}: CUDA error: uncorrectable ECC error encountered", None, 1, rank=rank)
    verdict = judge(Stop(Why.STALLED, exit_code=1, detail=failure.message), job)
    blamed = gpu_faults.blamed(job.placement, None)
    if not blamed:
        assert verdict.fault is None  # nowhere to count it
        return
    assert verdict.fault is not None and verdict.error is not None and verdict.error.type is ErrorType.DEVICE_FAULT
    met = bool(job.faulted_before & set(verdict.fault.gpus))
    if not met:
        assert (verdict.status, verdict.spends_retry) == (Status.QUEUED, False)
    else:
        assert verdict.status is (Status.QUEUED if job.attempt < job.max_attempts else Status.FAILED)
        assert verdict.spends_retry == (verdict.status is Status.QUEUED)


def test_an_oom_the_job_asked_to_recover_from_halves_the_micro_batch_without_spending_a_retry() -> None:
    oom = Failure(ErrorType.OOM, "torch.OutOfMemoryError: CUDA out of memory", None, 1)
    stop = Stop(Why.EXITED, exit_code=1, state=RankState(Phase.EXITED, 1), failure=oom)
    verdict: Verdict = judge(stop, Facts(attempt=3, max_attempts=3, spec=AUTO_MICRO_BATCH, ranks=2))
    assert (verdict.status, verdict.outcome, verdict.spends_retry) == (Status.QUEUED, "failed", False)
    assert verdict.values["spec"]["train"]["grad_accum_steps"] == 2
    assert [a["to"] for a in verdict.values["adjustments"]] == [2]
    assert judge(stop, Facts(attempt=3, max_attempts=3, spec={}, ranks=2)).status is Status.FAILED
