"""Replay a trace of jobs through a placement policy in simulated time (a discrete-event simulation).

The policy is any ``(queued, hosts, running) -> Decision`` function: ``schedule`` itself, or
``whole_host_fifo``, which is what the workers did before the scheduler (one worker per host takes
the next job in submission order and holds all of the host's GPUs, whatever the job asked for).
A pass runs at every arrival and every finish, as the leader would run one on each change. Nothing
here reads a clock or draws a random number it was not seeded for, so a replay is reproducible.

With ``stateful=True`` the policy also gets ``now``, ``quotas``, the reservations of the previous
pass and ``min_runtime_s``, and its preemptions are carried out: the victim stops at once, keeps the
work up to its last checkpoint (every ``checkpoint_every_s`` of its run; 0: it checkpoints on the
stop signal and keeps all; None: it keeps nothing), and goes back to the queue in its old place with
the rest of its work to do.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from jobs.scheduling.model import Decision, Host, NodePlacement, Placement, QueuedJob, Quota, Reservation, Waiting
from jobs.scheduling.policy import DEFAULT_MIN_RUNTIME_S, order_key, schedule

Policy = Callable[..., Decision]


@dataclass(frozen=True)
class TraceJob:
    id: str
    owner: str
    submit_s: float
    duration_s: float
    gpus: int  # per node
    nnodes: int = 1
    priority: int = 50
    timeout_s: float | None = None  # the most it may run (duration_s must not exceed it)
    preemptible: bool = True


@dataclass
class JobRun:
    """One run of a job: its first, or a resumption after a preemption (``attempt`` > 0)."""

    job: TraceJob
    start_s: float
    held_gpus: int  # what its placement held, which FIFO makes more than it asked
    run_s: float | None = None  # how long it ran; None: to the end of its work (duration_s)
    attempt: int = 0
    preempted: bool = False

    @property
    def wait_s(self) -> float:
        return self.start_s - self.job.submit_s

    @property
    def end_s(self) -> float:
        return self.start_s + (self.job.duration_s if self.run_s is None else self.run_s)


@dataclass(frozen=True)
class Replay:
    runs: tuple[JobRun, ...]
    never_started: tuple[str, ...]
    capacity_gpus: int
    busy_gpu_s: float  # GPU-seconds that jobs asked for and used
    waiting_s: float  # simulated time with at least one job queued
    busy_while_waiting_gpu_s: float
    passes: int
    lost_gpu_s: float = 0.0  # GPU-seconds of work preempted jobs lost since their last checkpoint
    contended_gpu_s: Mapping[str, float] | None = None  # per owner, GPU-seconds held while every owner had jobs queued
    preemptions: int = 0

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

    def waits(self, gpus: int | None = None, priority: int | None = None) -> list[float]:
        """Submission to first start, of the jobs asking ``gpus`` GPUs in all / of ``priority``."""
        return [r.wait_s for r in self.runs if r.attempt == 0 and (gpus is None or r.job.gpus * r.job.nnodes == gpus)
                and (priority is None or r.job.priority == priority)]

    def jain(self) -> float:
        """Jain's fairness index of the owners' contended GPU-seconds: 1 is an equal split."""
        xs = list((self.contended_gpu_s or {}).values())
        return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else float("nan")


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


def replay(trace: Sequence[TraceJob], hosts: Sequence[Host], policy: Policy, *, stateful: bool = False,
           quotas: Mapping[str, Quota] | None = None, min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
           checkpoint_every_s: float | None = None) -> Replay:
    arrivals = sorted(trace, key=lambda j: (j.submit_s, j.id))
    by_id = {j.id: j for j in arrivals}
    seq = {j.id: i for i, j in enumerate(arrivals)}
    hosts = list(hosts)
    capacity = sum(len(h.gpus) for h in hosts if h.alive)
    owners = sorted({j.owner for j in arrivals})
    queue: dict[str, QueuedJob] = {}
    running: dict[str, Placement] = {}
    current: dict[str, JobRun] = {}
    left_s = {j.id: j.duration_s for j in arrivals}  # work still to do
    attempts: Counter[str] = Counter()
    ends: list[tuple[float, str, int]] = []  # (end, job id, attempt); entries of preempted runs go stale
    held: tuple[Reservation, ...] = ()
    runs: list[JobRun] = []
    use: Counter[str] = Counter()  # GPUs each owner's running jobs asked
    contended: Counter[str] = Counter({o: 0 for o in owners})
    busy = 0  # GPUs in use by what the running jobs asked
    busy_gpu_s = waiting_s = busy_while_waiting = lost = 0.0
    t, nxt, passes, preempted = arrivals[0].submit_s if arrivals else 0.0, 0, 0, 0
    while nxt < len(arrivals) or ends:
        at = min(arrivals[nxt].submit_s if nxt < len(arrivals) else math.inf, ends[0][0] if ends else math.inf)
        dt = at - t
        busy_gpu_s += busy * dt
        if queue:
            waiting_s += dt
            busy_while_waiting += busy * dt
            if len({q.owner for q in queue.values()}) == len(owners):
                for o in owners:
                    contended[o] += use[o] * dt
        t = at
        while ends and ends[0][0] <= t:
            _, job_id, attempt = heapq.heappop(ends)
            if attempt != attempts[job_id] or job_id not in running:
                continue
            del running[job_id]
            j = by_id[job_id]
            busy -= j.gpus * j.nnodes
            use[j.owner] -= j.gpus * j.nnodes
        while nxt < len(arrivals) and arrivals[nxt].submit_s <= t:
            j = arrivals[nxt]
            queue[j.id] = QueuedJob(j.id, j.owner, j.nnodes, j.gpus, "gpu", submitted_seq=nxt, priority=j.priority,
                                    timeout_s=j.timeout_s, preemptible=j.preemptible)
            nxt += 1
        for _ in range(4):  # a pass, and again at once when its preemptions freed GPUs
            if stateful:
                decision = policy(list(queue.values()), hosts, list(running.values()), now=t, quotas=quotas,
                                  reservations=held, min_runtime_s=min_runtime_s)
                held = decision.reservations
            else:
                decision = policy(list(queue.values()), hosts, list(running.values()))
            passes += 1
            for p in decision.placements:
                job = by_id[p.job_id]
                del queue[p.job_id]
                running[p.job_id] = p
                heapq.heappush(ends, (t + left_s[p.job_id], p.job_id, attempts[p.job_id]))
                busy += job.gpus * job.nnodes
                use[job.owner] += job.gpus * job.nnodes
                current[p.job_id] = JobRun(job, t, sum(len(n.gpus) for n in p.nodes), left_s[p.job_id], attempts[p.job_id])
                runs.append(current[p.job_id])
            for victim, _, _ in decision.preemptions:
                if victim not in running:
                    continue
                job, run = by_id[victim], current[victim]
                ran = t - run.start_s
                if checkpoint_every_s == 0:
                    kept = ran  # it checkpoints on the stop signal, as torchyard's stop has it do
                else:
                    kept = math.floor(ran / checkpoint_every_s) * checkpoint_every_s if checkpoint_every_s else 0.0
                lost += (ran - kept) * job.gpus * job.nnodes
                left_s[victim] -= kept
                run.run_s, run.preempted = ran, True
                attempts[victim] += 1
                preempted += 1
                del running[victim]
                busy -= job.gpus * job.nnodes
                use[job.owner] -= job.gpus * job.nnodes
                queue[victim] = QueuedJob(job.id, job.owner, job.nnodes, job.gpus, "gpu", submitted_seq=seq[victim],
                                          priority=job.priority, timeout_s=job.timeout_s, preemptible=job.preemptible)
            if not decision.preemptions:
                break
    return Replay(tuple(runs), tuple(queue), capacity, busy_gpu_s, waiting_s, busy_while_waiting, passes, lost, dict(contended), preempted)
