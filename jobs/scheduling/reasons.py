"""Why a queued job waits, in words and numbers a user can act on.

Three kinds, checked in this order: it can never run on the live hosts (no host is big enough); it
does not fit what is free now; or it fitted what was free at the start of the pass and jobs ahead of
it in line took that. Capacity figures are those left after the pass, i.e. what ``torchyard hosts``
shows once the pass's placements start.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from jobs.scheduling.cluster import Cluster, Need
from jobs.scheduling.model import NodePlacement, Placement, QueuedJob, Reservation


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


# ---------------------------------------------------------------- priorities, quotas, preemption, backfill


def clock(t: float | None, now: float | None = None) -> str:
    """A start time as the user reads it (UTC), with its date unless it is the day of ``now``; None for one that
    depends on jobs with no timeout."""
    if t is None:
        return "when the jobs running there end"
    at = datetime.fromtimestamp(t, tz=timezone.utc)
    same_day = now is not None and datetime.fromtimestamp(now, tz=timezone.utc).date() == at.date()
    return "from about " + at.strftime("%H:%M" if same_day else "%b %d %H:%M")


def _jobs(victims: Sequence[Placement]) -> str:
    named = ", ".join(f"{v.job_id} (priority {v.priority}{', borrowed' if v.borrowed else ''})" for v in victims)
    return f"job{'s' if len(victims) > 1 else ''} {named}"


def preempting(victims: Sequence[Placement], draining: bool = False) -> str:
    text = f"preempting {_jobs(victims)} to make room"
    return text + ("; waiting for them to checkpoint and stop" if draining else "")


def preempted(by: QueuedJob, reclaims: bool, victim: Placement) -> str:
    if reclaims and victim.borrowed and victim.owner != by.owner:
        return f"preempted by job {by.id}: owner {by.owner} takes back GPUs of its quota that this job borrowed"
    return f"preempted by job {by.id} (priority {by.priority}) to make room"


def _hosts(nodes: Sequence[NodePlacement]) -> str:
    names = [n.host for n in nodes]
    return names[0] + " is" if len(names) == 1 else ", ".join(names) + " are"


def reserved(need: Need, reservation: Reservation, now: float | None = None) -> str:
    if need.whole:
        what = "every GPU of " + ("one host" if need.nnodes == 1 else f"{need.nnodes} hosts")
    elif need.nnodes == 1:
        what = f"{need.per_node} {_units('gpu', need.per_node)} on one host"
    else:
        what = f"{need.nnodes} hosts with {need.per_node} {_units('gpu', need.per_node)}"
    when = clock(reservation.from_s, now)
    return f"waiting for {what}: {_hosts(reservation.nodes)} reserved for it {when}; smaller jobs backfill until then"


def behind(job: QueuedJob, reservation: Reservation, now: float | None = None) -> str:
    return f"behind job {job.id} (priority {job.priority}): {_hosts(reservation.nodes)} reserved for it {clock(reservation.from_s, now)}"


def over_quota(owner: str, used: int, quota: int) -> str:
    return f"owner {owner} uses {used} of {quota} quota GPUs; it may borrow when GPUs are idle"


def unavailable(drained: Sequence[tuple[str, str]], quarantined: Sequence[tuple[str, int]]) -> str | None:
    """What is out of placement among the hosts a job could use: ``drained`` (host, reason), ``quarantined``
    (host, how many GPUs). None when nothing is."""
    parts = [f"host {host} drained: {reason}" for host, reason in drained]
    parts += [f"{n} {_units('gpu', n)} quarantined on {host}" for host, n in quarantined if n]
    return "; ".join(parts) or None
