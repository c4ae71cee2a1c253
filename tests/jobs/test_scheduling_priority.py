"""Who goes first, on clusters a reader can picture: priorities, fair share, quotas with borrowing,
preemption and the reservation it leaves, and backfill in front of a waiting large job."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from jobs.scheduling import Host, NodePlacement, Placement, QueuedJob, schedule
from jobs.scheduling.model import Preemption, Quota, Reservation

NOON = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0


def host(name: str = "gpu-a", n: int = 8) -> Host:
    return Host(name, tuple(range(n)))


def run(job_id: str, gpus: tuple[int, ...], *, owner: str = "bob", priority: int = 50, age_s: float = HOUR, host_id: str = "gpu-a",
        **kw: object) -> Placement:
    return Placement(job_id, (NodePlacement(0, host_id, gpus),), owner=owner, priority=priority, started_at=NOON - age_s, **kw)  # type: ignore[arg-type]


def job(job_id: str, gpus: int | str = 1, *, owner: str = "alice", seq: int = 0, **kw: object) -> QueuedJob:
    return QueuedJob(job_id, owner, 1, gpus, submitted_seq=seq, **kw)  # type: ignore[arg-type]


def test_placements_carry_what_preemption_and_quotas_read_later() -> None:
    decision = schedule([job("a", 2, priority=70, timeout_s=600, preemptible=False)], [host()], now=NOON)
    (p,) = decision.placements
    assert (p.owner, p.priority, p.preemptible, p.started_at, p.timeout_s, p.borrowed) == ("alice", 70, False, NOON, 600, False)


def test_among_equal_priorities_the_owner_using_fewer_gpus_goes_first() -> None:
    running = [run("r1", (0, 1, 2, 3), owner="alice"), run("r2", (4, 5), owner="bob")]
    queue = [job("alice-1", 1, seq=1), job("bob-1", 1, owner="bob", seq=2), job("bob-2", 1, owner="bob", seq=3), job("alice-2", 1, seq=4)]
    decision = schedule(queue, [host()], running)
    assert [p.job_id for p in decision.placements] == ["bob-1", "bob-2"]  # bob reaches alice's 4 only after both
    assert list(decision.waiting) == ["alice-1", "alice-2"]


def test_beyond_its_quota_an_owner_borrows_idle_gpus_and_the_placement_says_so() -> None:
    queue = [job(f"a{i}", 2, seq=i) for i in range(3)]
    decision = schedule(queue, [host()], quotas={"alice": Quota(gpus=4)})
    assert [(p.job_id, p.borrowed) for p in decision.placements] == [("a0", False), ("a1", False), ("a2", True)]


def test_an_owner_at_its_quota_with_nothing_idle_is_told_it_may_borrow_later() -> None:
    running = [run("r1", (0, 1, 2, 3), owner="alice"), run("r2", (4, 5, 6, 7), owner="bob")]
    decision = schedule([job("a", 1)], [host()], running, now=NOON, quotas={"alice": Quota(gpus=4), "bob": Quota(gpus=4)})
    assert decision.waiting["a"].reason == "owner alice uses 4 of 4 quota GPUs; it may borrow when GPUs are idle"
    assert decision.preemptions == ()


def test_an_owner_within_its_quota_reclaims_borrowed_gpus_even_from_a_higher_priority_job() -> None:
    quotas = {"alice": Quota(gpus=4), "bob": Quota(gpus=4)}
    running = [run("own", (0, 1, 2, 3), priority=90), run("lent-old", (4, 5), priority=90, borrowed=True, age_s=2 * HOUR),
               run("lent-new", (6, 7), priority=90, borrowed=True)]
    decision = schedule([job("a", 2, priority=10)], [host()], running, now=NOON, quotas=quotas)
    assert decision.placements == ()
    reclaimed = "preempted by job a: owner alice takes back GPUs of its quota that this job borrowed"
    assert decision.preemptions == (Preemption("lent-new", "a", reclaimed),)
    assert decision.waiting["a"].reason == "preempting job lent-new (priority 90, borrowed) to make room"
    assert decision.reservations == (Reservation("a", (NodePlacement(0, "gpu-a", (6, 7)),), NOON, ("lent-new",)),)


def test_a_higher_priority_job_preempts_the_cheapest_most_recent_set_never_a_young_or_protected_one() -> None:
    running = [run("big", (0, 1, 2, 3), priority=10), run("old", (4, 5), priority=10, age_s=3 * HOUR), run("new", (6,), priority=10),
               run("young", (7,), priority=10, age_s=60), run("kept", (), priority=10)]
    decision = schedule([job("hi", 2, priority=90)], [host()], running, now=NOON)
    assert decision.preemptions == (Preemption("old", "hi", "preempted by job hi (priority 90) to make room"),)
    protected = [run("a", (0, 1, 2, 3), priority=10, preemptible=False), run("b", (4, 5, 6, 7), priority=10, age_s=60)]
    decision = schedule([job("hi", 2, priority=90)], [host()], protected, now=NOON)
    assert decision.preemptions == () and decision.waiting["hi"].reason.startswith("waiting for 2 GPUs on one host")


def test_equal_priority_or_a_guaranteed_job_of_another_owner_is_never_preempted() -> None:
    running = [run("same", (0, 1, 2, 3), priority=50), run("guaranteed", (4, 5, 6, 7), priority=10)]
    decision = schedule([job("a", 4, priority=50)], [host()], running, now=NOON, quotas={"bob": Quota(gpus=8)})
    assert decision.preemptions == ()


def test_freed_gpus_are_held_for_the_preemptor_until_it_is_placed_on_them() -> None:
    running = [run("low", (0, 1, 2, 3), priority=10), run("other", (4, 5, 6, 7), priority=10, preemptible=False)]
    first = schedule([job("hi", 4, priority=90)], [host()], running, now=NOON)
    held = first.reservations
    # The victim is still checkpointing: nobody is placed, a newcomer does not preempt again.
    draining = schedule([job("hi", 4, priority=90), job("urgent", 4, priority=100, seq=1)], [host()], running, now=NOON + 10,
                        reservations=held)
    assert draining.placements == () and draining.preemptions == ()
    assert draining.waiting["hi"].reason == "preempting job low (priority 10) to make room; waiting for them to checkpoint and stop"
    # It has left: the GPUs go to the job they were held for, not to the higher-priority newcomer.
    after = schedule([job("hi", 4, priority=90), job("urgent", 4, priority=100, seq=1)], [host()], running[1:], now=NOON + 60,
                     reservations=held)
    assert [(p.job_id, p.nodes[0].gpus) for p in after.placements] == [("hi", (0, 1, 2, 3))]


def test_a_waiting_large_job_gets_a_reservation_and_only_jobs_that_cannot_delay_it_backfill() -> None:
    running = [run("r1", (0, 1, 2, 3), timeout_s=2 * HOUR), run("r2", (4, 5), timeout_s=2 * HOUR, age_s=HOUR / 2)]
    queue = [job("big", 8, seq=1), job("short", 1, seq=2, timeout_s=HOUR / 2), job("long", 1, seq=3, timeout_s=4 * HOUR),
             job("unknown", 1, seq=4)]
    decision = schedule(queue, [host()], running, now=NOON)
    assert [p.job_id for p in decision.placements] == ["short"]
    assert decision.waiting["big"].reason == (
        "waiting for 8 GPUs on one host: gpu-a is reserved for it from about 13:30; smaller jobs backfill until then")
    assert decision.waiting["long"].reason == "behind job big (priority 50): gpu-a is reserved for it from about 13:30"
    assert decision.reservations == (Reservation("big", (NodePlacement(0, "gpu-a", tuple(range(8))),), NOON + 1.5 * HOUR),)


def test_a_lower_priority_job_may_backfill_where_the_reserved_job_will_preempt_it() -> None:
    running = [run("r1", (0, 1, 2, 3), timeout_s=2 * HOUR, preemptible=False)]
    queue = [job("big", 8, seq=1, priority=80), job("filler", 2, seq=2, priority=20)]
    decision = schedule(queue, [host()], running, now=NOON)
    assert [p.job_id for p in decision.placements] == ["filler"]


def test_gpus_the_reserved_job_will_not_need_stay_usable_by_anyone() -> None:
    running = [run("r1", (0, 1, 2, 3, 4, 5), timeout_s=2 * HOUR)]
    decision = schedule([job("four", 4, seq=1), job("a", 1, seq=2), job("b", 1, seq=3)], [host()], running, now=NOON)
    # At its start 8 GPUs are free and it needs 4: of the 2 free now, both may be used indefinitely.
    assert [p.job_id for p in decision.placements] == ["a", "b"]
    assert "reserved for it from about 13:00" in decision.waiting["four"].reason


def test_a_reservation_handed_back_keeps_its_host_held_until_a_higher_priority_job_needs_it() -> None:
    hosts = [host("gpu-a"), host("gpu-b")]
    running = [run("r1", (0, 1, 2, 3, 4, 5), timeout_s=2 * HOUR), run("r2", tuple(range(8)), host_id="gpu-b", timeout_s=3 * HOUR)]
    first = schedule([job("big", 8, seq=1)], hosts, running, now=NOON)
    assert [n.host for r in first.reservations for n in r.nodes] == ["gpu-a"]
    # r1 ends early; bob, who uses nothing, submits a job with no timeout: gpu-a stays held for big.
    later = schedule([job("big", 8, seq=1), job("bob-1", 2, owner="bob", seq=2)], hosts, running[1:], now=NOON + 600,
                     reservations=first.reservations)
    assert [(p.job_id, p.nodes[0].host) for p in later.placements] == [("big", "gpu-a")]
    assert later.waiting["bob-1"].reason.startswith("waiting for 2 GPUs on one host: gpu-b is reserved for it from about 14:00")
    # A blocked job of higher priority takes the reservation over (nothing here may be preempted).
    protected = [dataclasses.replace(p, preemptible=False) for p in running]
    urgent = schedule([job("big", 8, seq=1), job("urgent", 8, seq=2, priority=90)], hosts, protected, now=NOON + 60,
                      reservations=first.reservations)
    assert [(r.job_id, r.nodes[0].host) for r in urgent.reservations] == [("urgent", "gpu-a")]
    assert urgent.waiting["big"].reason == "needs 8 GPUs on one host; all GPUs are busy"
