"""The placement policy over random hosts (some dead), running placements and queues: it never hands
out a GPU or CPU slot twice, places gangs whole on distinct live hosts, answers every queued job,
answers the same way every time, and packs so that large blocks stay whole."""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs.scheduling import Decision, Host, NodePlacement, Placement, QueuedJob, order_key, schedule
from jobs.scheduling.packing import largest_run, runs
from tests.quick_examples import examples

SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def host_strategy(draw: st.DrawFn, i: int) -> Host:
    contiguous = st.integers(0, 8).map(lambda n: tuple(range(n)))
    gpus = draw(contiguous | st.sets(st.integers(0, 15), max_size=10).map(lambda s: tuple(sorted(s))))
    free = None
    if gpus and draw(st.integers(0, 4)) == 0:  # the host keeps some GPUs back (in use outside torchyard)
        free = tuple(sorted(draw(st.sets(st.sampled_from(gpus)))))
    cpu = draw(st.integers(0, 16))
    return Host(f"h{i}", gpus, free, cpu, draw(st.integers(0, cpu)), alive=draw(st.integers(0, 5)) > 0)


@st.composite
def cluster_strategy(draw: st.DrawFn) -> tuple[list[Host], list[Placement]]:
    """Hosts and consistent running placements: disjoint GPUs, CPU slots within what is left."""
    hosts = [draw(host_strategy(i)) for i in range(draw(st.integers(0, 7)))]
    running: list[Placement] = []
    for h in hosts:
        free = list(h.offered_gpus())
        cpu_left = h.cpu_slots - h.cpu_slots_used
        for _ in range(draw(st.integers(0, 3))):
            gpus = tuple(sorted(draw(st.sets(st.sampled_from(free)))) if free else ())
            free = [g for g in free if g not in gpus]
            cpu = draw(st.integers(0, cpu_left)) if cpu_left > 0 else 0
            cpu_left -= cpu
            if gpus or cpu:
                running.append(Placement(f"r{len(running)}", (NodePlacement(0, h.id, gpus, cpu),)))
    return hosts, running


@st.composite
def job_strategy(draw: st.DrawFn, i: int) -> QueuedJob:
    device = draw(st.sampled_from(["gpu", "gpu", "cpu"]))
    nnodes = draw(st.sampled_from([1, 1, 1, 2, 3]))
    nproc: int | str = draw(st.integers(1, 10 if nnodes == 1 else 3))
    if device == "gpu" and draw(st.integers(0, 6)) == 0:
        nproc = "gpu"
    return QueuedJob(f"j{i}", draw(st.sampled_from(["alice", "bob"])), nnodes, nproc, device,
                     submitted_seq=draw(st.integers(0, 30)), priority=draw(st.sampled_from([0, 50, 50, 80])))


queue_strategy = st.integers(0, 25).flatmap(lambda n: st.tuples(*(job_strategy(i) for i in range(n))).map(list))


def free_after(hosts: list[Host], running: list[Placement], decision: Decision | None = None) -> dict[str, tuple[list[int], int]]:
    """Free GPU indices and CPU slots per live host, computed independently of the policy's own books."""
    held: dict[str, set[int]] = defaultdict(set)
    cpu: Counter[str] = Counter()
    for p in running + list(decision.placements if decision else ()):
        for node in p.nodes:
            held[node.host].update(node.gpus)
            cpu[node.host] += node.cpu_slots
    return {h.id: (sorted(set(h.offered_gpus()) - held[h.id]), h.cpu_slots - h.cpu_slots_used - cpu[h.id]) for h in hosts if h.alive}


def fair_sequence(queue: list[QueuedJob], hosts: list[Host], running: list[Placement], decision: Decision) -> list[str]:
    """The order a pass considers the jobs, recomputed: priority, then the owner with the smallest
    share of the live hosts (equal parts, no quotas here), counting what the pass placed, then
    submission order."""
    live = [h for h in hosts if h.alive]
    owners = {j.owner for j in queue} | {p.owner for p in running}
    share = (sum(len(h.gpus) for h in live) / max(1, len(owners)), sum(h.cpu_slots for h in live) / max(1, len(owners)))
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    placed = {p.job_id: p for p in decision.placements}
    for p in running:
        used[p.owner][0] += sum(len(n.gpus) for n in p.nodes)
        used[p.owner][1] += sum(n.cpu_slots for n in p.nodes)

    def ratio(owner: str) -> float:
        return max(u / s if s > 0 else (float("inf") if u else 0.0) for u, s in zip(used[owner], share, strict=True))

    out: list[str] = []
    left = sorted(queue, key=order_key)
    while left:
        top = left[0].priority
        heads = {}
        for j in left:
            if j.priority == top and j.owner not in heads:
                heads[j.owner] = j
        job = min(heads.values(), key=lambda j: (ratio(j.owner), j.submitted_seq, j.id))
        left.remove(job)
        out.append(job.id)
        if job.id in placed:
            used[job.owner][0] += sum(len(n.gpus) for n in placed[job.id].nodes)
            used[job.owner][1] += sum(n.cpu_slots for n in placed[job.id].nodes)
    return out


def fits(job: QueuedJob, free: dict[str, tuple[list[int], int]], hosts: dict[str, Host]) -> bool:
    if job.whole_host:
        whole = [h for h, (g, _) in free.items() if hosts[h].gpus and len(g) == len(hosts[h].gpus)]
        return len(whole) >= job.nnodes
    n = int(job.nproc_per_node)
    have = [h for h, (g, c) in free.items() if (len(g) if job.device == "gpu" else c) >= n]
    return len(have) >= job.nnodes


@SETTINGS
@given(cluster_strategy(), queue_strategy)
def test_every_placement_is_whole_disjoint_and_on_free_devices_of_live_hosts(cluster: tuple, queue: list[QueuedJob]) -> None:
    hosts, running = cluster
    decision = schedule(queue, hosts, running)
    by_id = {h.id: h for h in hosts}
    jobs = {j.id: j for j in queue}
    before = free_after(hosts, running)
    taken_gpus: set[tuple[str, int]] = set()
    cpu_taken: Counter[str] = Counter()
    for p in decision.placements:
        job = jobs[p.job_id]
        assert len(p.nodes) == job.nnodes, "a gang gets all its nodes in one decision"
        assert [n.node_rank for n in p.nodes] == list(range(job.nnodes))
        assert len({n.host for n in p.nodes}) == job.nnodes, "one node per host"
        for node in p.nodes:
            host = by_id[node.host]
            assert host.alive
            free_gpus, free_cpu = before[node.host]
            if job.device == "cpu":
                assert node.gpus == () and node.cpu_slots == job.nproc_per_node
                cpu_taken[node.host] += node.cpu_slots
                continue
            assert node.cpu_slots == 0
            assert list(node.gpus) == sorted(set(node.gpus))
            assert len(node.gpus) == (len(host.gpus) if job.whole_host else job.nproc_per_node)
            assert set(node.gpus) <= set(free_gpus), "only GPUs the host offers and no running job holds"
            for g in node.gpus:
                assert (node.host, g) not in taken_gpus, "no GPU in two placements"
                taken_gpus.add((node.host, g))
    for host_id, n in cpu_taken.items():
        assert n <= before[host_id][1], "CPU slots within the host's total"


@SETTINGS
@given(cluster_strategy(), queue_strategy)
def test_every_queued_job_is_placed_or_told_why_in_order(cluster: tuple, queue: list[QueuedJob]) -> None:
    hosts, running = cluster
    decision = schedule(queue, hosts, running)
    placed = [p.job_id for p in decision.placements]
    assert set(placed).isdisjoint(decision.waiting)
    assert sorted(placed + list(decision.waiting)) == sorted(j.id for j in queue)
    order = fair_sequence(queue, hosts, running, decision)
    assert placed == [j for j in order if j in set(placed)]
    assert list(decision.waiting) == [j for j in order if j in decision.waiting]
    assert [w.position for w in decision.waiting.values()] == list(range(1, len(decision.waiting) + 1))
    assert all(w.reason for w in decision.waiting.values())


@SETTINGS
@given(cluster_strategy(), queue_strategy)
def test_nothing_left_waiting_fits_what_is_left_and_the_reason_says_which_kind(cluster: tuple, queue: list[QueuedJob]) -> None:
    hosts, running = cluster
    decision = schedule(queue, hosts, running)
    by_id = {h.id: h for h in hosts}
    start, end = free_after(hosts, running), free_after(hosts, running, decision)
    ever = {h.id: (list(h.gpus), h.cpu_slots) for h in hosts if h.alive}
    jobs = {j.id: j for j in queue}
    for job_id, (_, reason) in decision.waiting.items():
        job = jobs[job_id]
        assert not fits(job, end, by_id), "skip, never idle: a waiting job does not fit what the pass left free"
        if not fits(job, ever, by_id):
            assert re.search(r"no host has|no live host|only \d+|none has", reason), reason
        elif fits(job, start, by_id):
            assert re.fullmatch(r"[1-9]\d* jobs? ahead of it", reason), reason
        else:
            assert reason.startswith("needs ") and not re.search(r"ahead|no host has|no live host|only \d+", reason), reason


@SETTINGS
@given(cluster_strategy(), queue_strategy, st.randoms(use_true_random=False))
def test_the_same_input_gives_the_same_decision_in_any_order(cluster: tuple, queue: list[QueuedJob], rnd: random.Random) -> None:
    hosts, running = cluster
    first = schedule(queue, hosts, running)
    assert schedule(queue, hosts, running) == first
    rnd.shuffle(hosts)
    rnd.shuffle(queue)
    rnd.shuffle(running)
    again = schedule(queue, hosts, running)
    assert again == first and list(again.waiting.items()) == list(first.waiting.items())


@SETTINGS
@given(cluster_strategy(), st.integers(1, 8))
def test_a_small_job_leaves_the_largest_free_block_whole_when_it_can(cluster: tuple, n: int) -> None:
    """Best fit: the host with the most free GPUs loses some only if no other host could take the job."""
    hosts, running = cluster
    before = {h: len(g) for h, (g, _) in free_after(hosts, running).items()}
    top = max(before.values(), default=0)
    decision = schedule([QueuedJob("small", "alice", 1, n)], hosts, running)
    after = {h: len(g) for h, (g, _) in free_after(hosts, running, decision).items()}
    elsewhere = any(n <= f < top for f in before.values()) or list(before.values()).count(top) > 1
    if decision.placements and elsewhere:
        assert max(after.values()) == top


@SETTINGS
@given(st.sets(st.integers(0, 15)), st.integers(1, 8))
def test_within_a_host_a_job_takes_the_shortest_run_that_holds_it(free: set[int], n: int) -> None:
    host = Host("h", tuple(range(16)), tuple(sorted(free)))
    decision = schedule([QueuedJob("j", "alice", 1, n)], [host])
    if len(free) < n:
        assert not decision.placements
        return
    left = sorted(free - set(decision.placements[0].nodes[0].gpus))
    longest_before = largest_run(sorted(free))
    lengths = [length for _, length in runs(sorted(free))]
    # When a shorter run holds the job, or another run is as long, the longest free run stays whole.
    if n <= longest_before and (any(n <= length < longest_before for length in lengths) or lengths.count(longest_before) > 1):
        assert largest_run(left) == longest_before
    if n <= longest_before:
        assert largest_run(sorted(decision.placements[0].nodes[0].gpus)) == n, "a job that fits one run gets contiguous GPUs"


@SETTINGS
@given(cluster_strategy(), queue_strategy)
def test_the_numbers_in_a_reason_are_the_cluster_s_own(cluster: tuple, queue: list[QueuedJob]) -> None:
    """Each figure a waiting job's reason quotes, recomputed from the hosts and placements."""
    hosts, running = cluster
    decision = schedule(queue, hosts, running)
    end = free_after(hosts, running, decision)
    live = [h for h in hosts if h.alive]
    order = fair_sequence(queue, hosts, running, decision)
    placed = {p.job_id for p in decision.placements}
    jobs = {j.id: j for j in queue}
    for job_id, (_, reason) in decision.waiting.items():
        job = jobs[job_id]

        def free_of(h: str, job: QueuedJob = job) -> int:
            return len(end[h][0]) if job.device == "gpu" else end[h][1]

        def total_of(h: Host, job: QueuedJob = job) -> int:
            return len(h.gpus) if job.device == "gpu" else h.cpu_slots

        if m := re.fullmatch(r"(\d+) jobs? ahead of it", reason):
            event("ahead")
            assert int(m[1]) == sum(1 for j in order[:order.index(job_id)] if j in placed)
        elif m := re.search(r"the most free on any host is (\d+) \((\S+)\)$", reason):
            event("most free")
            top = max(free_of(h.id) for h in live if total_of(h))
            assert int(m[1]) == top == free_of(m[2]) and m[2] == min(h.id for h in live if total_of(h) and free_of(h.id) == top)
        elif m := re.search(r"no host has (\d+) \(largest: (\S+) with (\d+)\)$", reason):
            event("never")
            assert int(m[3]) == max(total_of(h) for h in live) == total_of(next(h for h in live if h.id == m[2])) < int(m[1])
        elif m := re.fullmatch(r"needs (\d+) hosts with (\d+) free (GPUs?|CPU slots?); (\d+|none) (has|have) them", reason):
            event("gang")
            count = sum(1 for h in live if total_of(h) and free_of(h.id) >= int(m[2]))
            assert (0 if m[4] == "none" else int(m[4])) == count < int(m[1])
        elif m := re.search(r"the most free is (\d+) of (\d+) \((\S+)\)$", reason):
            event("whole")
            host = next(h for h in live if h.id == m[3])
            assert int(m[1]) == free_of(host.id) == max(free_of(h.id) for h in live if h.gpus) and int(m[2]) == len(host.gpus)
