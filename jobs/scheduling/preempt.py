"""Which running jobs a waiting job may stop to make room, and the cheapest set of them.

A job may preempt a running placement that is preemptible and has run at least ``min_runtime_s``
and either has a lower priority and no guarantee against this owner (its owner has no quota, or is
the same owner, or it runs on borrowed quota), or runs on borrowed quota of another owner while the
preemptor reclaims within its own quota (Kueue's reclaim; the victim's priority does not matter
then). The set to stop is the cheapest that makes the job fit: fewest GPUs released, then fewest
jobs, then the most recently started.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import combinations
from typing import NamedTuple

from jobs.scheduling import packing
from jobs.scheduling.cluster import Cluster, Need
from jobs.scheduling.model import Placement, QueuedJob, Quota

# Hosts with more candidate victims than this are searched over their most recent ones only: the
# exact search is exponential, and the most recent are the ones preferred anyway.
MAX_SUBSET = 8


def may_preempt(job: QueuedJob, victim: Placement, at: float, *, reclaims: bool, quotas: dict[str, Quota], min_runtime_s: float) -> bool:
    """Whether ``job`` may stop ``victim`` at time ``at``; ``reclaims``: its owner is within its GPU quota."""
    if not victim.preemptible or victim.started_at is None or at - victim.started_at < min_runtime_s:
        return False
    if victim.borrowed and reclaims and victim.owner != job.owner:
        return True
    if victim.priority >= job.priority:
        return False
    if victim.owner == job.owner or victim.borrowed:
        return True
    quota = quotas.get(victim.owner)
    return quota is None or quota.gpus is None  # an owner's jobs within its quota are guaranteed


class Victims(NamedTuple):
    hosts: list[int]
    victims: list[Placement]
    gpus: list[tuple[int, ...]]  # per chosen host, the GPUs the job gets there once the victims leave


def _cost(chosen: Iterable[Placement]) -> tuple[int, int, float]:
    chosen = list(chosen)
    newest = min((p.started_at or 0.0 for p in chosen), default=math.inf)
    return (sum(p.gpu_count for p in chosen), len(chosen), -newest)


def _cheapest(free: int, n: int, on_host: list[tuple[Placement, int]]) -> tuple[tuple[int, int, float], list[Placement]] | None:
    """The cheapest subset of the candidates on one host that frees ``n - free`` GPUs there."""
    short = n - free
    if short <= 0:
        return (0, 0, math.inf), []
    if sum(g for _, g in on_host) < short:
        return None
    pool = sorted(on_host, key=lambda c: (-(c[0].started_at or 0.0), c[0].job_id))[:MAX_SUBSET]
    best: tuple[tuple[int, int, float], list[Placement]] | None = None
    for size in range(1, len(pool) + 1):
        for subset in combinations(pool, size):
            if sum(g for _, g in subset) < short:
                continue
            cost = _cost(p for p, _ in subset)
            if best is None or cost < best[0]:
                best = (cost, [p for p, _ in subset])
    return best


def find(need: Need, cluster: Cluster, candidates: dict[int, list[tuple[Placement, int]]], excluded: set[int]) -> Victims | None:
    """The hosts, victims and GPUs that make ``need`` fit, or None; ``candidates`` maps host number to
    the placements the job may preempt there with the GPUs each holds on it."""
    options: list[tuple[tuple[int, int, float], int, list[Placement]]] = []
    hosts = set(candidates) if need.nnodes == 1 else set(range(len(cluster.ids)))
    for h in hosts:
        if h in excluded:
            continue
        offered = len(cluster.offered[h])
        n = offered if need.whole else need.per_node
        if n == 0 or offered < n:
            continue
        on_host = candidates.get(h, [])
        if need.whole:
            # every GPU must come free: all GPUs not free now must be held by candidates
            if len(cluster.free_gpus[h]) + sum(g for _, g in on_host) < offered:
                continue
            found = ((0, 0, math.inf), []) if not on_host else (_cost(p for p, _ in on_host), [p for p, _ in on_host])
        else:
            found = _cheapest(len(cluster.free_gpus[h]), n, on_host)
        if found is not None:
            options.append((found[0], h, found[1]))
    if len(options) < need.nnodes:
        return None
    options.sort(key=lambda o: (o[0], o[1]))
    chosen = options[:need.nnodes]
    victims: dict[str, Placement] = {}
    for _, _, vs in chosen:
        victims.update((v.job_id, v) for v in vs)
    if not victims:
        return None  # it fits without preempting: nothing to do here
    gpus = []
    for _, h, vs in chosen:
        released = {g for v in vs for node in v.nodes if node.host == cluster.ids[h] for g in node.gpus}
        pool = sorted(set(cluster.free_gpus[h]) | released)
        n = len(cluster.offered[h]) if need.whole else need.per_node
        gpus.append(packing.choose(pool, n))
    return Victims([h for _, h, _ in chosen], list(victims.values()), gpus)


def victims(job: QueuedJob, need: Need, cluster: Cluster, running: Iterable[Placement], stopping: set[str], excluded: set[int],
            now: float, *, reclaims: bool, quotas: dict[str, Quota], min_runtime_s: float) -> Victims | None:
    """The cheapest set of ``running`` jobs ``job`` may stop so that it fits, none of them already
    ``stopping`` and none on the ``excluded`` host numbers (held for the backfill reservation)."""
    candidates: dict[int, list[tuple[Placement, int]]] = {}
    for p in running:
        if p.job_id in stopping or not p.gpu_count:
            continue
        if not may_preempt(job, p, now, reclaims=reclaims, quotas=quotas, min_runtime_s=min_runtime_s):
            continue
        for node in p.nodes:
            h = cluster.number.get(node.host)
            if h is not None and node.gpus:
                candidates.setdefault(h, []).append((p, len(node.gpus)))
    if not candidates:
        return None
    return find(need, cluster, candidates, excluded)
