"""Usage is the attempts' placements times their durations, cut at the window and at midnight: properties of the
pure summary (jobs/reads/usage.py), each checked against a computation of its own."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.reads.usage import Span, parse_group_by, summarize

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=5)


@st.composite
def spans(draw: st.DrawFn) -> list[Span]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        start = T0 + timedelta(minutes=draw(st.integers(0, 6 * 24 * 60)))
        length = draw(st.one_of(st.none(), st.integers(0, 3 * 24 * 60)))  # None: still running
        finished = None if length is None else start + timedelta(minutes=length)
        out.append(Span(draw(st.sampled_from(["alice", "bob"])), f"j{draw(st.integers(0, 3))}", i, start, finished,
                        draw(st.integers(0, 8)), draw(st.integers(0, 4)), draw(st.booleans())))
    return out


window = st.one_of(st.none(), st.integers(0, 7 * 24 * 60).map(lambda m: T0 + timedelta(minutes=m)))


def held_hours(s: Span, start: datetime | None, end: datetime | None) -> float:
    lo = max(s.started, start) if start else s.started
    hi = min(s.finished or NOW, NOW, end or NOW)
    return max((hi - lo).total_seconds(), 0) / 3600


@given(spans(), window, window)
def test_gpu_hours_are_placements_times_the_time_held_inside_the_window(ss: list[Span], start: datetime | None,
                                                                        end: datetime | None) -> None:
    rows = summarize(ss, start, end, NOW, ("owner",))
    for owner in ("alice", "bob"):
        want = sum(s.gpus * held_hours(s, start, end) for s in ss if s.owner == owner)
        got = sum(r.gpu_hours for r in rows if r.owner == owner)
        assert got == pytest.approx(want, abs=1e-9)
        want_cpu = sum(s.cpu_slots * held_hours(s, start, end) for s in ss if s.owner == owner)
        assert sum(r.cpu_slot_hours for r in rows if r.owner == owner) == pytest.approx(want_cpu, abs=1e-9)


@given(spans(), window)
def test_days_add_up_to_the_owner_total_and_each_day_holds_at_most_24_hours_a_gpu(ss: list[Span], start: datetime | None) -> None:
    by_owner = {r.owner: r for r in summarize(ss, start, None, NOW, ("owner",))}
    by_day = summarize(ss, start, None, NOW, ("owner", "day"))
    for owner, row in by_owner.items():
        days = [r for r in by_day if r.owner == owner]
        assert sum(r.gpu_hours for r in days) == pytest.approx(row.gpu_hours, abs=1e-9)
        assert sum(r.preempted_gpu_hours for r in days) == pytest.approx(row.preempted_gpu_hours, abs=1e-9)
        assert {j for r in days for j in r.job_ids} == row.job_ids
    for r in by_day:
        gpus_of_owner = sum(s.gpus for s in ss if s.owner == r.owner)
        assert r.gpu_hours <= 24 * gpus_of_owner + 1e-9
        assert r.preempted_gpu_hours <= r.gpu_hours + 1e-9
        assert start is None or r.day >= start.date()
    assert [(r.owner, r.day) for r in by_day] == sorted((r.owner, r.day) for r in by_day)


@given(spans(), st.integers(0, 7 * 24 * 60))
def test_two_adjacent_windows_add_up_to_their_union(ss: list[Span], cut: int) -> None:
    middle = T0 + timedelta(minutes=cut)

    def total(start: datetime | None, end: datetime | None) -> float:
        return sum(r.gpu_hours for r in summarize(ss, start, end, NOW))

    assert total(None, middle) + total(middle, None) == pytest.approx(total(None, None), abs=1e-9)


def test_a_running_attempt_counts_until_now_and_attempts_count_once_per_group() -> None:
    running = Span("alice", "j1", 1, NOW - timedelta(hours=2), None, gpus=2, cpu_slots=0)
    before = Span("alice", "j1", 0, NOW - timedelta(hours=30), NOW - timedelta(hours=26), gpus=2, cpu_slots=0, preempted=True)
    [row] = summarize([running, before], None, None, NOW)
    assert (row.gpu_hours, row.preempted_gpu_hours, len(row.job_ids), row.attempts) == (pytest.approx(12.0), pytest.approx(8.0), 1, 2)


@pytest.mark.parametrize("text", ["", "owner,owner", "host", "day,week"])
def test_an_unknown_grouping_is_refused_in_the_user_s_words(text: str) -> None:
    with pytest.raises(ValueError, match="group_by: .* is not one of owner, day or owner,day"):
        parse_group_by(text)
