"""Why a queued job waits, in words and numbers a user can act on.

Three kinds, checked in this order: it can never run on the live hosts (no host is big enough); it
does not fit what is free now; or it fitted what was free at the start of the pass and jobs ahead of
it in line took that. Capacity figures are those left after the pass, i.e. what ``torchyard hosts``
shows once the pass's placements start.
"""

from __future__ import annotations

from jobs.scheduling.cluster import Cluster, Need


def _units(device: str, n: int) -> str:
    word = "GPU" if device == "gpu" else "CPU slot"
    return word if n == 1 else word + "s"


def _has(n: int, what: str = "them") -> str:
    if n == 0:
        return f"none has {what}"
    return f"{n} {'has' if n == 1 else 'have'} {what}"


def ahead(placed_before: int) -> str:
    return f"{placed_before} job{'' if placed_before == 1 else 's'} ahead of it"


def never(need: Need, cluster: Cluster) -> str | None:
    """The reason when no choice of live hosts could ever hold the job, else None."""
    inv = cluster.inventory(need.device)
    if need.whole:
        with_gpus = inv.hosts_with_units()
        if with_gpus >= need.nnodes:
            return None
        if with_gpus == 0:
            return f"needs every GPU of {'one host' if need.nnodes == 1 else f'{need.nnodes} hosts'}; no live host has GPUs"
        return f"needs {need.nnodes} hosts with GPUs; only {with_gpus} live {'host has' if with_gpus == 1 else 'hosts have'} GPUs"
    n, units = need.per_node, _units(need.device, need.per_node)
    enough = inv.count_at_least(n)
    if enough >= need.nnodes:
        return None
    if need.nnodes > 1:
        return f"needs {need.nnodes} hosts with {n} {units}; {'only ' if enough else ''}{_has(enough, str(n))}"
    largest = inv.largest()
    if largest is None:
        return f"needs {n} {units} on one host; no live host has {_units(need.device, 2)}"
    h, total = largest
    return f"needs {n} {units} on one host; no host has {n} (largest: {cluster.ids[h]} with {total})"


def capacity(need: Need, cluster: Cluster) -> str:
    """The reason when the job would fit the live hosts, but not what is free on them."""
    pool = cluster.pool(need.device)
    if need.whole:
        if need.nnodes > 1:
            return f"needs {need.nnodes} hosts with every GPU free; {_has(len(pool.whole))}"
        most = pool.most_free()
        if most is None:
            return "needs every GPU of one host free; all GPUs are busy"
        h, free = most
        return f"needs every GPU of one host free; the most free is {free} of {pool.totals[h]} ({cluster.ids[h]})"
    n, units = need.per_node, _units(need.device, need.per_node)
    if need.nnodes > 1:
        return f"needs {need.nnodes} hosts with {n} free {units}; {_has(pool.count_at_least(n))}"
    most = pool.most_free()
    if most is None:
        return f"needs {n} {units} on one host; all {_units(need.device, 2)} are busy"
    h, free = most
    return f"needs {n} {units} on one host; the most free on any host is {free} ({cluster.ids[h]})"
