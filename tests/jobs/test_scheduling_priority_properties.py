"""The priority rules over random clusters, running jobs, quotas and queues: nothing oversubscribed,
quotas exceeded only by borrowing, preemption only of jobs the rules give up, priority order kept
except where backfill cannot delay the job passed, and a large job never starved by small ones."""

from __future__ import annotations

import random
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.scheduling import Decision, Host, NodePlacement, Placement, QueuedJob, schedule
from jobs.scheduling.model import Quota
from jobs.scheduling.simulate import TraceJob, replay
from tests.quick_examples import examples

SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = 1_000_000.0
MIN_RUNTIME = 300.0
OWNERS = ["alice", "bob", "carol"]


@st.composite
def world(draw: st.DrawFn) -> tuple[list[Host], list[Placement], list[QueuedJob], dict[str, Quota]]:
    hosts = [Host(f"h{i}", tuple(range(draw(st.integers(0, 8)))), cpu_slots=draw(st.integers(0, 4)), alive=draw(st.integers(0, 6)) > 0)
             for i in range(draw(st.integers(1, 4)))]
    running: list[Placement] = []
    for h in hosts:
        free = list(h.gpus)
        while free and draw(st.integers(0, 3)):
            n = draw(st.integers(1, len(free)))
            gpus, free = tuple(free[:n]), free[n:]
            running.append(Placement(
                f"r{len(running)}", (NodePlacement(0, h.id, gpus),), owner=draw(st.sampled_from(OWNERS)),
                priority=draw(st.sampled_from([10, 50, 90])), preemptible=draw(st.integers(0, 4)) > 0,
                started_at=draw(st.sampled_from([None, NOW, NOW - 100, NOW - 400, NOW - 5000])),
                timeout_s=draw(st.sampled_from([None, 600.0, 3600.0, 7200.0])), borrowed=draw(st.booleans())))
    queue = [QueuedJob(f"q{i}", draw(st.sampled_from(OWNERS)), draw(st.sampled_from([1, 1, 1, 2])),
                       *draw(st.sampled_from([1, 1, 2, 3, 4, 8, "gpu"]).map(lambda n: (n, "gpu"))
                             | st.integers(1, 3).map(lambda n: (n, "cpu"))),
                       submitted_seq=i,
                       priority=draw(st.sampled_from([10, 50, 90])), timeout_s=draw(st.sampled_from([None, 300.0, 1800.0, 9000.0])),
                       preemptible=draw(st.booleans()))
             for i in range(draw(st.integers(0, 12)))]
    quotas = {o: Quota(gpus=draw(st.integers(0, 8))) for o in OWNERS if draw(st.booleans())}
    return hosts, running, queue, quotas


Pass = tuple[Decision, list[Placement]]


def passes(hosts: list[Host], running: list[Placement], queue: list[QueuedJob], quotas: dict[str, Quota]) -> list[Pass]:
    """A pass, then the pass after it with the victims gone and the reservations handed back: each
    decision with the running placements it saw."""
    first = schedule(queue, hosts, running, now=NOW, quotas=quotas, min_runtime_s=MIN_RUNTIME)
    gone = {v for v, _, _ in first.preemptions}
    placed = {p.job_id for p in first.placements}
    held = list(first.reservations)
    running2 = [p for p in running if p.job_id not in gone] + list(first.placements)
    second = schedule([j for j in queue if j.id not in placed], hosts, running2, now=NOW + 60, quotas=quotas, reservations=held,
                      min_runtime_s=MIN_RUNTIME)
    return [(first, running), (second, running2)]


def held_by(placements: list[Placement]) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for p in placements:
        for n in p.nodes:
            for g in n.gpus:
                assert (n.host, g) not in out, f"GPU {n.host}:{g} held by {out.get((n.host, g))} and {p.job_id}"
                out[(n.host, g)] = p.job_id
    return out


@SETTINGS
@given(world())
def test_never_oversubscribed_and_reserved_gpus_go_only_to_their_job(w: tuple) -> None:
    hosts, _, queue, quotas = w
    jobs = {j.id: j for j in queue}
    for decision, running in passes(*w):
        _check_disjoint(decision, running, jobs)


def _check_disjoint(decision: Decision, running: list[Placement], jobs: dict[str, QueuedJob]) -> None:
    busy = set(held_by(running + list(decision.placements)))
    for r in decision.reservations:
        if r.victims:  # the free part of a preemptor's reservation is given to nobody else
            victims = set(r.victims)
            for n in r.nodes:
                for g in n.gpus:
                    assert (n.host, g) not in busy or held_by(running).get((n.host, g)) in victims
    for p in decision.placements:
        assert len(p.nodes) == jobs[p.job_id].nnodes and len({n.host for n in p.nodes}) == len(p.nodes)


@SETTINGS
@given(world())
def test_preemption_picks_only_what_the_rules_give_up_and_the_preemptor_waits(w: tuple) -> None:
    hosts, running, queue, quotas = w
    decision = schedule(queue, hosts, running, now=NOW, quotas=quotas, min_runtime_s=MIN_RUNTIME)
    jobs, by_id = {j.id: j for j in queue}, {p.job_id: p for p in running}
    placed = {p.job_id for p in decision.placements}
    victims = [v for v, _, _ in decision.preemptions]
    assert len(victims) == len(set(victims))
    for victim_id, by, reason in decision.preemptions:
        v, job = by_id[victim_id], jobs[by]
        assert by not in placed and "preempting" in decision.waiting[by].reason and by in reason
        assert v.preemptible and v.started_at is not None and NOW - v.started_at >= MIN_RUNTIME
        if v.priority >= job.priority:
            assert v.borrowed and v.owner != job.owner and job.owner in quotas, "equal or higher priority only to reclaim borrowed GPUs"


@SETTINGS
@given(world())
def test_a_quota_is_exceeded_only_by_placements_marked_borrowed(w: tuple) -> None:
    for decision, running in passes(*w):
        quotas = w[3]
        used: dict[str, int] = defaultdict(int)
        for p in running:
            used[p.owner] += p.gpu_count
        for p in decision.placements:
            if p.owner in quotas:
                assert p.borrowed == (used[p.owner] + p.gpu_count > quotas[p.owner].gpus)
            else:
                assert not p.borrowed
            used[p.owner] += p.gpu_count


def fits_free(job: QueuedJob, free: dict[str, set[int]], hosts: dict[str, Host]) -> bool:
    if job.whole_host:
        return sum(1 for h, f in free.items() if hosts[h].gpus and len(f) == len(hosts[h].gpus)) >= job.nnodes
    return sum(1 for f in free.values() if len(f) >= int(job.nproc_per_node)) >= job.nnodes


@SETTINGS
@given(world())
def test_a_lower_priority_job_starts_before_a_waiting_higher_one_only_where_it_cannot_take_its_place(w: tuple) -> None:
    hosts, running, queue, quotas = w
    decision = schedule(queue, hosts, running, now=NOW, quotas=quotas, min_runtime_s=MIN_RUNTIME)
    jobs, host_of = {j.id: j for j in queue}, {h.id: h for h in hosts}
    busy = set(held_by(running + list(decision.placements)))
    for r in decision.reservations:
        if r.victims:
            busy.update((n.host, g) for n in r.nodes for g in n.gpus)
    head = next((r for r in decision.reservations if not r.victims), None)
    head_hosts = {n.host for n in head.nodes} if head else set()
    for p in decision.placements:
        low = jobs[p.job_id]
        for wid in decision.waiting:
            high = jobs[wid]
            if high.device != "gpu" or low.device != "gpu":
                continue  # CPU slots are another resource; the property tests of the pass check those
            if high.priority <= low.priority or any(r.job_id == wid and r.victims for r in decision.reservations):
                continue
            if {n.host for n in p.nodes} & head_hosts:
                continue  # backfill on the reserved host: it ends before the reserved start, or gives way
            free = {h.id: {g for g in h.gpus if (h.id, g) not in busy} for h in hosts
                    if h.alive and not (head is not None and wid != head.job_id and h.id in head_hosts)}
            for n in p.nodes:
                if n.host in free:
                    free[n.host] |= set(n.gpus)
            assert not fits_free(high, free, host_of), f"{wid} (priority {high.priority}) would fit in place of {p.job_id}"


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0, 300), st.sampled_from(["alice", "bob"]), st.integers(1, 2))
def test_a_large_job_starts_within_a_bound_behind_a_stream_of_small_ones(seed: int, big_at: float, big_owner: str, hosts_n: int) -> None:
    rng = random.Random(seed)
    longest = 100.0
    stream = []
    t = 0.0
    while t < 1200:  # a third more small work than the hosts can take: the queue never drains
        t += rng.expovariate(0.15 * hosts_n)
        d = rng.uniform(5, longest)
        owner = rng.choice(["alice", "bob"])
        stream.append(TraceJob(f"s{len(stream):04d}", owner, t, d, rng.choice([1, 2]), timeout_s=min(longest, 2 * d)))
    trace = [*stream, TraceJob("big", big_owner, big_at, 50.0, 8, timeout_s=50.0)]
    hosts = [Host(f"h{i}", tuple(range(8))) for i in range(hosts_n)]
    result = replay(trace, hosts, schedule, stateful=True, min_runtime_s=0)
    start = next(r.start_s for r in result.runs if r.job.id == "big")
    assert start - big_at <= 6 * longest  # without the reservation it waits over 1,200 s in most of these traces
