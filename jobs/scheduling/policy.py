"""The placement policy: ``schedule(queued, hosts, running) -> Decision``, one pure function.

Jobs are considered by priority (higher first), then submission order. Each gets the best fit that
holds it now: ``nnodes`` distinct live hosts with the fewest free units that still fit, so the
hosts with the most free stay whole for the jobs that need them; a gang gets all its hosts in this
decision or none. A job that does not fit waits and the pass goes on to the jobs behind it (they
may take what it could not use). That can hold a large job back behind a stream of small ones;
backfill that reserves capacity for it without delaying it comes with priorities and quotas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter

from jobs.scheduling import reasons
from jobs.scheduling.cluster import Cluster, Need, Snapshot
from jobs.scheduling.model import Decision, Host, Placement, QueuedJob, Waiting


def order_key(job: QueuedJob) -> tuple[int, int, str]:
    """The order in which a pass considers queued jobs; the id settles exact ties."""
    return (-job.priority, job.submitted_seq, job.id)


def schedule(queued: Iterable[QueuedJob], hosts: Iterable[Host], running: Iterable[Placement] = ()) -> Decision:
    """Place what fits now, and say for every other queued job where it stands and what holds it.

    ``running`` are the placements of the jobs that hold devices now; their GPUs and CPU slots are
    not free. Dead hosts get nothing. Raises ValueError for duplicate job or host ids, or a job that
    is both queued and running.
    """
    jobs = sorted(queued, key=attrgetter("submitted_seq", "id"))
    jobs.sort(key=attrgetter("priority"), reverse=True)  # a stable sort: equal priorities keep that order
    running = list(running)
    queued_ids = {j.id for j in jobs}
    if len(queued_ids) != len(jobs):
        raise ValueError("queued job ids must be distinct")
    both = queued_ids.intersection(p.job_id for p in running)
    if both:
        raise ValueError(f"jobs both queued and running: {sorted(both)}")
    cluster = Cluster(hosts, running)
    start = Snapshot(cluster)

    placements: list[Placement] = []
    left: list[tuple[str, tuple, int]] = []  # (job id, its ask, jobs placed before it in this pass)
    needs: dict[tuple, Need] = {}
    # Free capacity only shrinks during a pass, so an ask that did not fit once does not fit again:
    # on a full cluster the tail of a long queue costs a set lookup per job.
    no_fit: set[tuple] = set()
    smallest_misfit = {"gpu": math.inf, "cpu": math.inf}  # single-node asks of at least this many fail
    for job in jobs:
        ask = (job.device, job.nnodes, job.nproc_per_node)
        if ask not in no_fit:
            need = needs.get(ask)
            if need is None:
                need = needs[ask] = Need.of(job)
            single = need.nnodes == 1 and not need.whole
            found = None if single and need.per_node >= smallest_misfit[need.device] else cluster.find(need)
            if found is not None:
                placements.append(cluster.place(job.id, need, found))
                continue
            no_fit.add(ask)
            if single:
                smallest_misfit[need.device] = min(smallest_misfit[need.device], need.per_node)
        left.append((job.id, ask, len(placements)))

    reason_of: dict[tuple, str | None] = {}  # None: it fitted at the start, so the jobs ahead took it
    ahead: dict[int, str] = {}
    waiting: dict[str, Waiting] = {}
    for position, (job_id, ask, before) in enumerate(left, 1):
        if ask in reason_of:
            text = reason_of[ask]
        else:
            need = needs[ask]
            text = reason_of[ask] = None if start.fits(need) else reasons.never(need, cluster) or reasons.capacity(need, cluster)
        if text is None:
            text = ahead.get(before) or ahead.setdefault(before, reasons.ahead(before))
        waiting[job_id] = Waiting(position, text)
    return Decision(tuple(placements), waiting)
