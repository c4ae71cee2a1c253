"""``python -m bench --only scheduler``: the placement policy alone, no services.

(a) One pass of ``jobs.scheduling.schedule`` over 1,000 hosts x 8 GPUs and 10,000 queued jobs, on an
idle cluster, a half-busy one and a full one (goal: under 100 ms). (b) A discrete-event replay of a
synthetic trace of 1,000 jobs on four 8-GPU hosts, the scheduler against the one-job-per-worker FIFO
the workers ran before it: GPU utilisation (goal: at least 90%) and queueing delay. (c) ``bench.priority``:
priorities, fair share, quotas, preemption and backfill in the same replay."""

from __future__ import annotations

import gc
import logging
import random
import statistics
import time
from typing import Any

from bench import priority
from bench.common import Ctx, pct
from jobs.scheduling import Host, NodePlacement, Placement, QueuedJob, schedule
from jobs.scheduling.simulate import Replay, head_of_line, replay, synthetic_trace, whole_host_fifo

log = logging.getLogger("bench")

HOSTS, GPUS_PER_HOST, QUEUED = 1000, 8, 10_000
SIZES, WEIGHTS = (1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1)
TRACE = {"n": 1000, "seed": 26, "median_s": 1800.0, "sigma": 1.0, "load": 1.1}
GOALS = {"pass_ms": 100.0, "utilisation": 0.90}


def _cluster(busy: float, rng: random.Random) -> tuple[list[Host], list[Placement]]:
    """Hosts with a ``busy`` share of their GPUs held by running jobs, in blocks as a packer leaves them."""
    hosts = [Host(f"gpu-{i:04d}", tuple(range(GPUS_PER_HOST)), cpu_slots=32) for i in range(HOSTS)]
    running: list[Placement] = []
    for h in hosts:
        held = round(rng.triangular(0, GPUS_PER_HOST, busy * GPUS_PER_HOST)) if 0 < busy < 1 else int(busy * GPUS_PER_HOST)
        if held:
            running.append(Placement(f"r-{h.id}", (NodePlacement(0, h.id, tuple(range(held))),)))
    return hosts, running


def _queue(rng: random.Random) -> list[QueuedJob]:
    """Mostly single-node jobs of 1-8 GPUs, one in twenty a 2-node gang, a few CPU jobs and priorities."""
    jobs = []
    for i in range(QUEUED):
        if rng.random() < 0.03:
            jobs.append(QueuedJob(f"q{i:05d}", "carol", 1, rng.choice((1, 2, 4)), "cpu", submitted_seq=i))
            continue
        nnodes = 2 if rng.random() < 0.05 else 1
        jobs.append(QueuedJob(f"q{i:05d}", rng.choice(("alice", "bob")), nnodes, rng.choices(SIZES, WEIGHTS)[0],
                              submitted_seq=i, priority=rng.choice((50, 50, 50, 80))))
    return jobs


def pass_time(rounds: int) -> dict[str, Any]:
    rng = random.Random(11)
    queue = _queue(rng)
    out: dict[str, Any] = {}
    for name, busy in (("idle", 0.0), ("half busy", 0.5), ("full", 1.0)):
        hosts, running = _cluster(busy, rng)
        times = []
        decision = schedule(queue, hosts, running)  # warm-up, and the figures below
        for _ in range(rounds):
            gc.collect()
            t0 = time.perf_counter()
            schedule(queue, hosts, running)
            times.append(time.perf_counter() - t0)
        out[name] = {"median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3, "min_ms": min(times) * 1e3,
                     "placed": len(decision.placements), "waiting": len(decision.waiting), "running": len(running)}
        log.info("scheduler pass, %s: median %.1f ms, max %.1f ms, %d placed", name, out[name]["median_ms"],
                 out[name]["max_ms"], out[name]["placed"])
    return out


def _summary(r: Replay) -> dict[str, Any]:
    waits = r.waits()
    return {
        "utilisation": r.utilisation(), "utilisation_while_waiting": r.utilisation_while_waiting(),
        "mean_wait_h": statistics.mean(waits) / 3600, "p50_wait_h": pct(waits, 50) / 3600, "p99_wait_h": pct(waits, 99) / 3600,
        "mean_wait_h_by_gpus": {str(g): statistics.mean(r.waits(g)) / 3600 for g in SIZES if r.waits(g)},
        "span_h": r.span_s / 3600, "held_gpu_h": sum(x.held_gpus * x.job.duration_s for x in r.runs) / 3600,
        "used_gpu_h": r.busy_gpu_s / 3600, "jobs": len(r.runs), "never_started": len(r.never_started), "passes": r.passes,
    }


def replays() -> dict[str, Any]:
    hosts = [Host(f"gpu-{c}", tuple(range(8))) for c in "abcd"]
    trace = synthetic_trace(**TRACE, sizes=SIZES, weights=WEIGHTS, capacity_gpus=32)  # type: ignore[arg-type]
    out = {}
    for name, policy in (("scheduler", schedule), ("head_of_line", head_of_line), ("fifo", whole_host_fifo)):
        t0 = time.perf_counter()
        out[name] = _summary(replay(trace, hosts, policy))
        out[name]["replay_s"] = time.perf_counter() - t0
        log.info("replay %s: utilisation %.3f, mean wait %.1f h", name, out[name]["utilisation"], out[name]["mean_wait_h"])
    return out


def scheduler(ctx: Ctx) -> dict[str, Any]:
    return {
        "config": {"hosts": HOSTS, "gpus_per_host": GPUS_PER_HOST, "queued": QUEUED, "trace": TRACE,
                   "trace_sizes": SIZES, "trace_weights": WEIGHTS, "replay_hosts": "4 x 8 GPUs", "goals": GOALS},
        "pass": pass_time(5 if ctx.quick else 21),
        "replay": replays(),
        "priority": priority.priority(),
    }

