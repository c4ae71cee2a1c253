"""Priorities, fair share, quotas, preemption and backfill in the trace replay (part of ``python -m bench
--only scheduler``; no services).

A synthetic trace of 1,000 jobs (1, 2, 4 or 8 GPUs; log-normal durations; three priority levels; two
owners with equal quotas of 16 GPUs) on four 8-GPU hosts, offered at 1.2 times what the hosts serve,
replayed through three policies: plain FIFO (best fit in submission order, priorities ignored); the
pass with priorities and fair share but no clock (so no preemption and no backfill reservation); and
the whole policy, where a preempted job loses the work since its last checkpoint (every 10 minutes)
and goes back to the queue; and the whole policy again with the victim checkpointing on the stop
signal, as torchyard's stop lets a job do (it loses nothing). Figures: time from submit to first start of the high-priority jobs, p50
and p99; utilisation (GPU-time held by running jobs, work later lost included, and without it); and
Jain's fairness index of the GPU-hours the two owners held while both had jobs waiting, once with
equal demand and once with one owner submitting twice as much.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import time
from typing import Any

from bench.common import pct
from jobs.scheduling import Decision, Host, Placement, QueuedJob, schedule
from jobs.scheduling.model import Quota
from jobs.scheduling.simulate import Replay, TraceJob, replay

log = logging.getLogger("bench")

SIZES, WEIGHTS = (1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1)
PRIORITIES, PRIORITY_WEIGHTS = (20, 50, 80), (0.3, 0.5, 0.2)
CONFIG = {"n": 1000, "seed": 27, "median_s": 1800.0, "sigma": 1.0, "load": 1.2, "timeout_over_duration": [1.2, 3.0],
          "quota_gpus": 16, "min_runtime_s": 300.0, "checkpoint_every_s": 600.0, "hosts": "4 x 8 GPUs",
          "goals": {"utilisation": 0.90, "jain": 0.95}}


def trace(alice_share: float = 0.5) -> list[TraceJob]:
    rng = random.Random(CONFIG["seed"])
    mean_gpus = sum(s * w for s, w in zip(SIZES, WEIGHTS, strict=True))
    rate = CONFIG["load"] * 32 / (mean_gpus * CONFIG["median_s"] * math.exp(CONFIG["sigma"] ** 2 / 2))
    t, out = 0.0, []
    lo, hi = CONFIG["timeout_over_duration"]
    for i in range(CONFIG["n"]):
        t += rng.expovariate(rate)
        size = rng.choices(SIZES, WEIGHTS)[0]
        d = rng.lognormvariate(math.log(CONFIG["median_s"]), CONFIG["sigma"])
        priority = rng.choices(PRIORITIES, PRIORITY_WEIGHTS)[0]
        owner = "alice" if rng.random() < alice_share else "bob"
        out.append(TraceJob(f"p{i:05d}", owner, t, d, size, priority=priority, timeout_s=d * rng.uniform(lo, hi)))
    return out


def fifo(queued: list[QueuedJob], hosts: list[Host], running: list[Placement]) -> Decision:
    """The best-fit pass in plain submission order: one owner, one priority."""
    return schedule([dataclasses.replace(j, owner="all", priority=50) for j in queued], hosts, running)


def _summary(r: Replay) -> dict[str, Any]:
    high, all_waits = r.waits(priority=80), r.waits()
    cap = r.capacity_gpus * r.span_s
    return {
        "high_p50_wait_h": pct(high, 50) / 3600, "high_p99_wait_h": pct(high, 99) / 3600, "high_mean_wait_h": statistics.mean(high) / 3600,
        "mean_wait_h_by_priority": {str(p): statistics.mean(r.waits(priority=p)) / 3600 for p in PRIORITIES},
        "mean_wait_h": statistics.mean(all_waits) / 3600, "utilisation": r.utilisation(),
        "useful_utilisation": (r.busy_gpu_s - r.lost_gpu_s) / cap if cap else math.nan,
        "lost_gpu_h": r.lost_gpu_s / 3600, "preemptions": r.preemptions, "jain": r.jain(),
        "contended_gpu_h": {o: x / 3600 for o, x in (r.contended_gpu_s or {}).items()},
        "span_h": r.span_s / 3600, "never_started": len(r.never_started), "passes": r.passes,
    }


def priority() -> dict[str, Any]:
    hosts = [Host(f"gpu-{c}", tuple(range(8))) for c in "abcd"]
    quotas = {o: Quota(gpus=CONFIG["quota_gpus"]) for o in ("alice", "bob")}
    out: dict[str, Any] = {"config": CONFIG}
    full = {"stateful": True, "quotas": quotas, "min_runtime_s": CONFIG["min_runtime_s"]}
    for demand, share in (("equal demand", 0.5), ("alice submits twice as much", 2 / 3)):
        tr = trace(share)
        runs: dict[str, Any] = {}
        for name, policy, kw in (
            ("fifo", fifo, {}),
            ("priority, no clock", schedule, {}),
            ("priority, quotas, preemption, backfill", schedule, {**full, "checkpoint_every_s": CONFIG["checkpoint_every_s"]}),
            ("the same, checkpoint on the stop signal", schedule, {**full, "checkpoint_every_s": 0.0}),
        ):
            t0 = time.perf_counter()
            runs[name] = _summary(replay(tr, hosts, policy, **kw))
            runs[name]["replay_s"] = time.perf_counter() - t0
            x = runs[name]
            log.info("priority replay (%s), %s: high-priority wait p50 %.2f h p99 %.2f h; utilisation %.1f%% (useful %.1f%%); "
                     "Jain %.3f; %d preemptions", demand, name, x["high_p50_wait_h"], x["high_p99_wait_h"], 100 * x["utilisation"],
                     100 * x["useful_utilisation"], x["jain"], x["preemptions"])
        out[demand] = runs
    return out
