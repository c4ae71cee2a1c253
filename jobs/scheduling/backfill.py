"""Backfill without delay: a reservation for the first job in line that waits for a block of GPUs.

Its earliest start on each host comes from the running jobs' expected ends (started_at + timeout_s;
a job with no timeout holds its GPUs indefinitely as far as this is concerned). It gets the host(s)
where that start is earliest, and their free GPUs leave the pool. A later job may still use them if
it cannot delay the reserved job: its timeout ends before that start, or the reserved job may
preempt it by then, or it takes only GPUs the reserved job will not need (``extra``). The start
therefore never moves later while the job keeps its reservation; handed back to the next pass, the
reservation keeps its hosts held from the start of that pass, before the jobs ahead of it in line
take what came free there, until the job is placed or a blocked job of higher priority takes the
reservation over. So it cannot starve behind a stream of smaller jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.scheduling import packing
from jobs.scheduling.cluster import Cluster, Need
from jobs.scheduling.model import NodePlacement, Placement, QueuedJob, Reservation


@dataclass
class Hold:
    job: QueuedJob
    hosts: list[int]
    start: float  # infinity: the running jobs there have no known end
    free: dict[int, list[int]]  # the held hosts' GPUs free now, out of the cluster's pool
    extra: dict[int, int]  # of those, how many the reserved job will not need at its start
    reservation: Reservation
    sticky: bool = False  # handed back from the pass before: held from the start of this one


def release(hold: Hold, cluster: Cluster) -> None:
    for h, free in hold.free.items():
        cluster.release(h, free)
    hold.free = {h: [] for h in hold.hosts}


def take(hold: Hold, need: Need, cluster: Cluster, **meta: object) -> Placement | None:
    """The reserved job itself on its held hosts, when what is free there now holds it."""
    if len(hold.hosts) != need.nnodes:
        return None
    nodes = []
    for rank, h in enumerate(hold.hosts):
        n = len(cluster.offered[h]) if need.whole else need.per_node
        if len(hold.free[h]) < n:
            return None
        nodes.append(NodePlacement(rank, cluster.ids[h], packing.choose(hold.free[h], n)))
    for node, h in zip(nodes, hold.hosts, strict=True):
        hold.free[h] = [g for g in hold.free[h] if g not in node.gpus]
    release(hold, cluster)
    return Placement(hold.job.id, tuple(nodes), **meta)  # type: ignore[arg-type]


def plan(job: QueuedJob, need: Need, cluster: Cluster, holders: dict[int, list[tuple[float, int, int]]], now: float,
         only: list[int] | None = None) -> Hold | None:
    """Reserve hosts for ``job`` (among ``only``, when given); ``holders`` maps host number to
    (expected end, GPUs there, GPU indices ...) of the placements that will release GPUs there.
    None when no host could ever hold it."""
    options = []
    for h in range(len(cluster.offered)) if only is None else only:
        offered = cluster.offered[h]
        n = len(offered) if need.whole else need.per_node
        if n == 0 or len(offered) < n:
            continue
        free = cluster.free_gpus[h]
        have, start, released = len(free), now, []
        if have < n:
            for end, count, *gpus in sorted(holders.get(h, ())):
                have += count
                released.extend(gpus)
                if have >= n:
                    start = max(end, now)
                    break
            else:
                continue  # GPUs held for others never come back to it
        options.append((start, -len(free), h, free, released, n))
    if len(options) < need.nnodes:
        return None
    options.sort(key=lambda o: o[:3])
    chosen = options[:need.nnodes]
    start = max(o[0] for o in chosen)
    nodes, free_now, extra = [], {}, {}
    for rank, (_, _, h, free, released, n) in enumerate(chosen):
        nodes.append(NodePlacement(rank, cluster.ids[h], packing.choose(sorted(set(free) | set(released)), n)))
        free_now[h] = list(free)
        later = sum(c for end, c, *_ in holders.get(h, ()) if end <= start)
        extra[h] = max(0, min(len(free), len(free) + later - n))
        cluster.claim(h, free)
    reservation = Reservation(job.id, tuple(nodes), None if math.isinf(start) else start)
    return Hold(job, [o[2] for o in chosen], start, free_now, extra, reservation, sticky=only is not None)


def place(hold: Hold, job: QueuedJob, need: Need, cluster: Cluster, harmless: bool, **meta: object) -> Placement | None:
    """Put a single-node GPU ``job`` on a held host if it fits there without delaying the reserved job:
    ``harmless`` (it ends or can be preempted in time) lets it use every free GPU there, else only
    the ``extra`` ones."""
    if need.nnodes != 1 or need.whole or need.device != "gpu":
        return None
    n = need.per_node
    fitting = [h for h in hold.hosts if n <= (len(hold.free[h]) if harmless else min(hold.extra[h], len(hold.free[h])))]
    if not fitting:
        return None
    h = min(fitting, key=lambda x: (len(hold.free[x]), x))
    gpus = packing.choose(hold.free[h], n)
    hold.free[h] = [g for g in hold.free[h] if g not in gpus]
    hold.extra[h] = min(hold.extra[h] - (0 if harmless else n), len(hold.free[h]))
    return Placement(job.id, (NodePlacement(0, cluster.ids[h], gpus),), **meta)  # type: ignore[arg-type]


def fits_held(hold: Hold | None, need: Need) -> bool:
    """Whether ``need`` would fit what is free on the held hosts, were they not held."""
    if hold is None or need.device != "gpu" or need.whole or need.nnodes != 1:
        return False
    return any(len(f) >= need.per_node for f in hold.free.values())
