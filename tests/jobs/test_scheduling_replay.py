"""Trace replays in simulated time: the scheduler and the old whole-host FIFO on the same trace."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling import Host, schedule
from jobs.scheduling.simulate import TraceJob, head_of_line, replay, synthetic_trace, whole_host_fifo
from tests.quick_examples import examples


def test_four_one_gpu_jobs_share_a_host_where_fifo_runs_them_one_after_another() -> None:
    trace = [TraceJob(f"j{i}", "alice", 0.0, 10.0, 1) for i in range(4)]
    host = [Host("gpu-a", (0, 1, 2, 3))]
    ours, fifo = replay(trace, host, schedule), replay(trace, host, whole_host_fifo)
    assert [r.start_s for r in ours.runs] == [0, 0, 0, 0] and ours.utilisation() == pytest.approx(1.0)
    assert [r.start_s for r in fifo.runs] == [0, 10, 20, 30] and fifo.utilisation() == pytest.approx(0.25)
    assert {r.held_gpus for r in fifo.runs} == {4} and {r.held_gpus for r in ours.runs} == {1}
    assert sum(fifo.waits()) / 4 == pytest.approx(15.0) and ours.waits() == [0, 0, 0, 0]


def test_a_job_no_host_can_hold_is_reported_and_the_replay_still_ends() -> None:
    trace = [TraceJob("huge", "alice", 0.0, 5.0, 16), TraceJob("small", "alice", 1.0, 5.0, 2)]
    result = replay(trace, [Host("gpu-a", tuple(range(8)))], schedule)
    assert result.never_started == ("huge",)
    assert [r.job.id for r in result.runs] == ["small"]


def test_the_synthetic_trace_is_fixed_by_its_seed() -> None:
    a, b = synthetic_trace(200, seed=3), synthetic_trace(200, seed=3)
    assert a == b and a != synthetic_trace(200, seed=4)
    assert {j.gpus for j in a} <= {1, 2, 4, 8}
    assert all(x.submit_s < y.submit_s for x, y in zip(a, a[1:], strict=False))
    assert all(j.duration_s > 0 for j in a)


trace_strategy = st.lists(
    st.tuples(st.floats(0, 100), st.floats(0.5, 50), st.sampled_from([1, 2, 3, 4, 8]), st.sampled_from([1, 1, 2])),
    max_size=30,
).map(lambda rows: [TraceJob(f"j{i:02d}", "alice", s, d, g, n) for i, (s, d, g, n) in enumerate(rows)])


@settings(max_examples=examples(150), deadline=None)
@given(trace_strategy, st.integers(1, 3))
def test_replays_start_jobs_after_submission_and_never_exceed_the_gpus(trace: list[TraceJob], nhosts: int) -> None:
    hosts = [Host(f"h{i}", tuple(range(8))) for i in range(nhosts)]
    for policy in (schedule, head_of_line, whole_host_fifo):
        result = replay(trace, hosts, policy)
        assert {r.job.id for r in result.runs} | set(result.never_started) == {j.id for j in trace}
        assert all(r.start_s >= r.job.submit_s for r in result.runs)
        events = sorted([(r.end_s, -r.held_gpus) for r in result.runs] + [(r.start_s, r.held_gpus) for r in result.runs])
        held = 0
        for _, change in events:  # ends sort before starts at the same instant
            held += change
            assert held <= 8 * nhosts
        assert result.busy_gpu_s == pytest.approx(sum(r.job.gpus * r.job.nnodes * r.job.duration_s for r in result.runs))
        if policy is not schedule:  # the other two never start a job before one submitted earlier
            in_turn = [j.id for j in sorted(trace, key=lambda j: (j.submit_s, j.id))]
            assert [r.job.id for r in result.runs] == in_turn[:len(result.runs)]
