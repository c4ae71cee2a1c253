"""Replay a trace of jobs through a placement policy in simulated time (a discrete-event simulation).

The policy is any ``(queued, hosts, running) -> Decision`` function: ``schedule`` itself, or
``whole_host_fifo``, which is what the workers did before the scheduler (one worker per host takes
the next job in submission order and holds all of the host's GPUs, whatever the job asked for).
A pass runs at every arrival and every finish, as the leader would run one on each change. Nothing
here reads a clock or draws a random number it was not seeded for, so a replay is reproducible.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobs.scheduling.model import Decision, Host, NodePlacement, Placement, QueuedJob, Waiting
from jobs.scheduling.policy import order_key, schedule

Policy = Callable[[list[QueuedJob], list[Host], list[Placement]], Decision]


@dataclass(frozen=True)
class TraceJob:
    id: str
    owner: str
    submit_s: float
    duration_s: float
    gpus: int  # per node
    nnodes: int = 1
    priority: int = 50


@dataclass(frozen=True)
class JobRun:
    job: TraceJob
    start_s: float
    held_gpus: int  # what its placement held, which FIFO makes more than it asked

    @property
    def wait_s(self) -> float:
        return self.start_s - self.job.submit_s

    @property
    def end_s(self) -> float:
        return self.start_s + self.job.duration_s


@dataclass(frozen=True)
class Replay:
    runs: tuple[JobRun, ...]
    never_started: tuple[str, ...]
    capacity_gpus: int
    busy_gpu_s: float  # GPU-seconds that jobs asked for and used
    waiting_s: float  # simulated time with at least one job queued
    busy_while_waiting_gpu_s: float
    passes: int

    @property
    def span_s(self) -> float:
        if not self.runs:
            return 0.0
        return max(r.end_s for r in self.runs) - min(r.job.submit_s for r in self.runs)

    def utilisation(self) -> float:
        """GPU-time used by jobs over the GPU-time of the hosts, first submission to last finish."""
        return self.busy_gpu_s / (self.capacity_gpus * self.span_s) if self.span_s else float("nan")

    def utilisation_while_waiting(self) -> float:
        """The same, counted only while some job waits: idle GPUs then are the policy's doing."""
        return self.busy_while_waiting_gpu_s / (self.capacity_gpus * self.waiting_s) if self.waiting_s else float("nan")

    def waits(self, gpus: int | None = None) -> list[float]:
        return [r.wait_s for r in self.runs if gpus is None or r.job.gpus * r.job.nnodes == gpus]


def synthetic_trace(n: int = 1000, *, seed: int = 26, sizes: Sequence[int] = (1, 2, 4, 8),
                    weights: Sequence[float] = (0.4, 0.3, 0.2, 0.1), median_s: float = 1800.0, sigma: float = 1.0,
                    load: float = 1.1, capacity_gpus: int = 32, owners: Sequence[str] = ("alice", "bob")) -> list[TraceJob]:
    """``n`` single-node jobs with Poisson arrivals and log-normal durations.

    Arrivals come at ``load`` times the rate the hosts can serve (offered GPU-seconds per second over
    ``capacity_gpus``), so above 1 the queue stays loaded and the policy, not the arrivals, sets the
    utilisation.
    """
    rng = random.Random(seed)
    mean_gpus = sum(s * w for s, w in zip(sizes, weights, strict=True)) / sum(weights)
    mean_s = median_s * math.exp(sigma**2 / 2)
    rate = load * capacity_gpus / (mean_gpus * mean_s)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        size = rng.choices(sizes, weights)[0]
        out.append(TraceJob(f"t{i:05d}", owners[i % len(owners)], t, rng.lognormvariate(math.log(median_s), sigma), size))
    return out


def whole_host_fifo(queued: list[QueuedJob], hosts: list[Host], running: list[Placement]) -> Decision:
    """Before the scheduler: each idle host's worker takes the next job in submission order and holds
    every GPU of the host; a job waits while the one ahead of it waits."""
    busy = {node.host for p in running for node in p.nodes}
    idle = [h for h in sorted(hosts, key=lambda h: h.id) if h.alive and h.id not in busy]
    placements: list[Placement] = []
    order = sorted(queued, key=lambda j: (j.submitted_seq, j.id))
    for i, job in enumerate(order):
        if job.nnodes > len(idle):
            return Decision(tuple(placements), {j.id: Waiting(k + 1, "waits for an idle worker") for k, j in enumerate(order[i:])})
        taken, idle = idle[:job.nnodes], idle[job.nnodes:]
        placements.append(Placement(job.id, tuple(NodePlacement(r, h.id, h.gpus) for r, h in enumerate(taken))))
    return Decision(tuple(placements), {})


def head_of_line(queued: list[QueuedJob], hosts: list[Host], running: list[Placement]) -> Decision:
    """``schedule`` with strict order: nothing starts past the first job that does not fit. The
    other choice for the skip ``schedule`` makes; the replay shows what each one costs."""
    decision = schedule(queued, hosts, running)
    if not decision.waiting:
        return decision
    order = [j.id for j in sorted(queued, key=order_key)]
    ahead = set(order[:order.index(next(iter(decision.waiting)))])
    kept = tuple(p for p in decision.placements if p.job_id in ahead)
    # The jobs it holds back get its reason, in line behind it.
    held = [j for j in order if j not in ahead]
    return Decision(kept, {j: Waiting(i + 1, "behind the first job that does not fit" if i else decision.waiting[j].reason)
                           for i, j in enumerate(held)})


def replay(trace: Sequence[TraceJob], hosts: Sequence[Host], policy: Policy) -> Replay:
    arrivals = sorted(trace, key=lambda j: (j.submit_s, j.id))
    by_id = {j.id: j for j in arrivals}
    hosts = list(hosts)
    capacity = sum(len(h.gpus) for h in hosts if h.alive)
    queue: dict[str, QueuedJob] = {}
    running: dict[str, Placement] = {}
    ends: list[tuple[float, str]] = []
    runs: list[JobRun] = []
    busy = 0  # GPUs in use by what the running jobs asked
    busy_gpu_s = waiting_s = busy_while_waiting = 0.0
    t, nxt, passes = arrivals[0].submit_s if arrivals else 0.0, 0, 0
    while nxt < len(arrivals) or ends:
        at = min(arrivals[nxt].submit_s if nxt < len(arrivals) else math.inf, ends[0][0] if ends else math.inf)
        dt = at - t
        busy_gpu_s += busy * dt
        if queue:
            waiting_s += dt
            busy_while_waiting += busy * dt
        t = at
        while ends and ends[0][0] <= t:
            _, job_id = heapq.heappop(ends)
            del running[job_id]
            busy -= by_id[job_id].gpus * by_id[job_id].nnodes
        while nxt < len(arrivals) and arrivals[nxt].submit_s <= t:
            j = arrivals[nxt]
            queue[j.id] = QueuedJob(j.id, j.owner, j.nnodes, j.gpus, "gpu", submitted_seq=nxt, priority=j.priority)
            nxt += 1
        decision = policy(list(queue.values()), hosts, list(running.values()))
        passes += 1
        for p in decision.placements:
            job = by_id[p.job_id]
            del queue[p.job_id]
            running[p.job_id] = p
            heapq.heappush(ends, (t + job.duration_s, p.job_id))
            busy += job.gpus * job.nnodes
            runs.append(JobRun(job, t, sum(len(n.gpus) for n in p.nodes)))
    return Replay(tuple(runs), tuple(queue), capacity, busy_gpu_s, waiting_s, busy_while_waiting, passes)
