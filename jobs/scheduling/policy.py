"""The placement policy: ``schedule(queued, hosts, running) -> Decision``, one pure function.

Jobs are considered by priority (higher first), then submission order. Each gets the best fit that
holds it now: ``nnodes`` distinct live hosts with the fewest free units that still fit, so the
hosts with the most free stay whole for the jobs that need them; a gang gets all its hosts in this
decision or none. A job that does not fit waits and the pass goes on to the jobs behind it (they
may take what it could not use). That can hold a large job back behind a stream of small ones;
backfill that reserves capacity for it without delaying it comes with priorities and quotas.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    jobs = sorted(queued, key=order_key)
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
    left: list[tuple[str, Need, int]] = []  # (job id, need, jobs placed before it in this pass)
    # Free capacity only shrinks during a pass, so what did not fit once does not fit again; this is
    # what makes the tail of a long queue on a full cluster cost a dictionary lookup per job.
    no_fit: set[Need] = set()
    smallest_misfit = {"gpu": float("inf"), "cpu": float("inf")}  # single-node asks of at least this fail
    for job in jobs:
        need = Need.of(job)
        hosts_found = None
        single = need.nnodes == 1 and not need.whole
        if need not in no_fit and not (single and need.per_node >= smallest_misfit[need.device]):
            hosts_found = cluster.find(need)
        if hosts_found is None:
            no_fit.add(need)
            if single:
                smallest_misfit[need.device] = min(smallest_misfit[need.device], need.per_node)
            left.append((job.id, need, len(placements)))
            continue
        placements.append(cluster.place(job.id, need, hosts_found))

    explained: dict[Need, str] = {}
    fitted_at_start: dict[Need, bool] = {}
    waiting: dict[str, Waiting] = {}
    for position, (job_id, need, before) in enumerate(left, 1):
        fits = fitted_at_start.get(need)
        if fits is None:
            fits = fitted_at_start[need] = start.fits(need)
        if fits:
            waiting[job_id] = Waiting(position, reasons.ahead(before))
            continue
        text = explained.get(need)
        if text is None:
            text = explained[need] = reasons.never(need, cluster) or reasons.capacity(need, cluster)
        waiting[job_id] = Waiting(position, text)
    return Decision(tuple(placements), waiting)
