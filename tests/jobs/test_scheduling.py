"""The placement policy on small clusters a reader can picture: what is placed where, and the exact
words a waiting job's reason shows."""

from __future__ import annotations

import pytest

from jobs.scheduling import Host, NodePlacement, Placement, QueuedJob, Waiting, schedule


def gpu_host(name: str, n: int = 8, *, alive: bool = True) -> Host:
    return Host(name, tuple(range(n)), alive=alive)


def holding(job_id: str, host: str, *gpus: int) -> Placement:
    return Placement(job_id, (NodePlacement(0, host, tuple(gpus)),))


def job(job_id: str, gpus: int | str = 1, nnodes: int = 1, seq: int = 0, **kw: object) -> QueuedJob:
    return QueuedJob(job_id, "alice", nnodes, gpus, submitted_seq=seq, **kw)  # type: ignore[arg-type]


def test_a_normal_submission_to_an_idle_host_is_placed_with_no_reason() -> None:
    decision = schedule([job("a", 2)], [gpu_host("gpu-a", 4)])
    assert decision.placements == (Placement("a", (NodePlacement(0, "gpu-a", (0, 1)),), owner="alice"),)
    assert decision.waiting == {}


def test_too_few_free_gpus_on_any_host_names_the_most_free_one() -> None:
    running = [holding("r1", "gpu-a", *range(6)), holding("r2", "gpu-b", *range(7))]
    decision = schedule([job("big", 4)], [gpu_host("gpu-a"), gpu_host("gpu-b")], running)
    assert decision.waiting == {"big": Waiting(1, "needs 4 GPUs on one host; the most free on any host is 2 (gpu-a)")}


def test_a_gang_short_of_hosts_says_how_many_have_room() -> None:
    running = [holding("r1", "gpu-b", *range(6))]
    decision = schedule([job("gang", 4, nnodes=2)], [gpu_host("gpu-a"), gpu_host("gpu-b")], running)
    assert decision.placements == ()
    assert decision.waiting["gang"].reason == "needs 2 hosts with 4 free GPUs; 1 has them"


def test_a_job_no_live_host_could_ever_hold_says_so_with_the_largest_host() -> None:
    hosts = [gpu_host("gpu-a", 2), gpu_host("gpu-b", 4), gpu_host("gpu-c", 8, alive=False)]
    decision = schedule([job("huge", 8), job("wide", 4, nnodes=3, seq=1)], hosts)
    assert decision.waiting == {
        "huge": Waiting(1, "needs 8 GPUs on one host; no host has 8 (largest: gpu-b with 4)"),
        "wide": Waiting(2, "needs 3 hosts with 4 GPUs; only 1 has 4"),
    }


def test_a_job_that_fitted_until_jobs_ahead_took_the_gpus_counts_them() -> None:
    decision = schedule([job("a", 2, seq=1), job("b", 2, seq=2), job("c", 2, seq=3), job("d", 16, seq=4)], [gpu_host("gpu-a", 4)])
    assert [p.job_id for p in decision.placements] == ["a", "b"]
    assert decision.waiting == {
        "c": Waiting(1, "2 jobs ahead of it"),
        "d": Waiting(2, "needs 16 GPUs on one host; no host has 16 (largest: gpu-a with 4)"),
    }


def test_cpu_jobs_count_slots_and_whole_host_jobs_count_every_gpu() -> None:
    hosts = [Host("cpu-a", cpu_slots=4, cpu_slots_used=2), gpu_host("gpu-a"), Host("z-none")]
    running = [holding("r", "gpu-a", *range(5))]
    queue = [QueuedJob("c", "bob", 1, 4, "cpu"), QueuedJob("w", "bob", 1, "gpu", "gpu", 1), QueuedJob("nogpu", "bob", 2, "gpu", "gpu", 2)]
    decision = schedule(queue, hosts, running)
    assert decision.waiting == {
        "c": Waiting(1, "needs 4 CPU slots on one host; the most free on any host is 2 (cpu-a)"),
        "w": Waiting(2, "needs every GPU of one host free; the most free is 3 of 8 (gpu-a)"),
        "nogpu": Waiting(3, "needs 2 hosts with GPUs; only 1 live host has GPUs"),
    }


def test_dead_hosts_get_nothing() -> None:
    decision = schedule([job("a")], [gpu_host("gpu-a", alive=False)])
    assert decision.waiting == {"a": Waiting(1, "needs 1 GPU on one host; no live host has GPUs")}


def test_small_jobs_fill_the_small_hosts_so_an_8_gpu_job_still_finds_a_whole_host() -> None:
    hosts = [gpu_host("big", 8), gpu_host("small-1", 4), gpu_host("small-2", 4)]
    queue = [job(f"one-{i}", 1, seq=i) for i in range(8)] + [job("eight", 8, seq=9)]
    decision = schedule(queue, hosts)
    where = {p.job_id: p.nodes[0].host for p in decision.placements}
    assert where["eight"] == "big"
    assert sorted(where[f"one-{i}"] for i in range(8)) == ["small-1"] * 4 + ["small-2"] * 4
    assert decision.waiting == {}


def test_two_gangs_that_want_the_same_hosts_do_not_deadlock() -> None:
    hosts = [gpu_host("h1", 4), gpu_host("h2", 4), gpu_host("h3", 4)]
    decision = schedule([job("g1", 4, nnodes=2, seq=1), job("g2", 4, nnodes=2, seq=2), job("solo", 4, seq=3)], hosts)
    g1 = decision.placements[0]
    assert g1.job_id == "g1" and [n.host for n in g1.nodes] == ["h1", "h2"] and all(n.gpus == (0, 1, 2, 3) for n in g1.nodes)
    assert [p.job_id for p in decision.placements] == ["g1", "solo"]
    assert decision.waiting == {"g2": Waiting(1, "1 job ahead of it")}


def test_priority_goes_first_then_submission_order() -> None:
    decision = schedule([job("early", 4, seq=1), job("urgent", 4, seq=2, priority=90), job("late", 4, seq=3)], [gpu_host("gpu-a", 4)])
    assert [p.job_id for p in decision.placements] == ["urgent"]
    assert list(decision.waiting) == ["early", "late"]


def test_gpu_indices_stay_in_contiguous_aligned_blocks() -> None:
    decision = schedule([job("pair", 2)], [gpu_host("gpu-a")], [holding("r", "gpu-a", 0, 5)])
    assert decision.placements[0].nodes[0].gpus == (6, 7)  # the short run, so 1-4 stays whole
    decision = schedule([job("pair", 2)], [gpu_host("gpu-a")], [holding("r", "gpu-a", 0)])
    assert decision.placements[0].nodes[0].gpus == (2, 3)  # an aligned pair, not 1-2


def test_a_host_that_keeps_gpus_back_is_not_given_them() -> None:
    host = Host("gpu-a", tuple(range(4)), free_gpus=(2, 3))
    decision = schedule([job("a", 2), job("b", 1, seq=1)], [host])
    assert decision.placements[0].nodes[0].gpus == (2, 3)
    assert decision.waiting["b"].reason == "1 job ahead of it"


@pytest.mark.parametrize("make", [
    lambda: QueuedJob("x", "a", 0, 1),
    lambda: QueuedJob("x", "a", 1, 0),
    lambda: QueuedJob("x", "a", 1, "gpu", "cpu"),
    lambda: QueuedJob("x", "a", 1, 1, "tpu"),  # type: ignore[arg-type]
    lambda: Host("h", (0, 0)),
    lambda: Host("h", (0, 1), free_gpus=(2,)),
    lambda: schedule([job("a"), job("a")], []),
    lambda: schedule([job("a")], [gpu_host("h"), gpu_host("h")]),
    lambda: schedule([job("a")], [gpu_host("h"), gpu_host("h", alive=False)]),
    lambda: schedule([job("a")], [gpu_host("h")], [holding("a", "h", 0)]),
])
def test_inconsistent_input_is_refused(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        make()
