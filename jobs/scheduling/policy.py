"""The placement policy: ``schedule(queued, hosts, running) -> Decision``, one pure function.

Jobs are considered by priority (higher first), then fair share among owners (``fairshare``), then
submission order. Jobs holding a reservation from an earlier preemption go before all of them, on
exactly the GPUs held for them. Each job gets the best fit that holds it now: ``nnodes`` distinct
live hosts with the fewest free units that still fit, so the hosts with the most free stay whole
for the jobs that need them; a gang gets all its hosts in this decision or none. A job that does
not fit may preempt (``preempt``; it is placed in a later pass, once its victims have checkpointed
and left). Otherwise the pass goes on to the jobs behind it, except that the waiting GPU job of the
highest priority submitted first gets a reservation (``backfill``) that the jobs after it may use
only where they cannot delay it. Preemption and backfill need ``now``; without it a job that does
not fit just waits, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from operator import attrgetter

from jobs.scheduling import backfill, preempt, reasons
from jobs.scheduling.cluster import Cluster, Need, Snapshot
from jobs.scheduling.fairshare import Usage, fair_order
from jobs.scheduling.model import Decision, Host, NodePlacement, Placement, Preemption, QueuedJob, Quota, Reservation, Waiting

DEFAULT_MIN_RUNTIME_S = 300.0


def order_key(job: QueuedJob) -> tuple[int, int, str]:
    """The order in which a pass considers queued jobs; the id settles exact ties."""
    return (-job.priority, job.submitted_seq, job.id)


def _meta(job: QueuedJob, now: float | None, borrowed: bool) -> dict[str, object]:
    return {"owner": job.owner, "priority": job.priority, "preemptible": job.preemptible, "started_at": now,
            "timeout_s": job.timeout_s, "borrowed": borrowed}


def _carry(reservations: Iterable[Reservation], queued: dict[str, QueuedJob], hosts: list[Host],
           running: list[Placement]) -> tuple[list[Reservation], list[Reservation], Reservation | None]:
    """The reservations of earlier passes that still stand: from preemptions, (ready to place, still
    draining); and the backfill reservation of the first job in line, if any.

    One from a preemption stands while its job is queued, its hosts live and its GPUs offered, and
    each of its GPUs is free or held by one of its victims; otherwise it is dropped and the job is
    considered afresh. A backfill one stands while its job is queued and its hosts live.
    """
    offered = {h.id: set(h.offered_gpus()) for h in hosts if h.alive}
    holder = {(n.host, g): p.job_id for p in running for n in p.nodes for g in n.gpus}
    claimed: set[tuple[str, int]] = set()
    ready, draining = [], []
    head: Reservation | None = None
    reservations = sorted(reservations, key=lambda r: order_key(queued[r.job_id]) if r.job_id in queued else ())
    for r in reservations:
        job = queued.get(r.job_id)
        if job is None or len(r.nodes) != job.nnodes or job.device != "gpu":
            continue
        if not r.victims:
            preempting = any(x.victims and x.job_id == r.job_id for x in reservations)
            if head is None and all(n.host in offered for n in r.nodes) and not preempting:
                head = r
            continue
        devices = [(n.host, g) for n in r.nodes for g in n.gpus]
        if any(n.host not in offered or not set(n.gpus) <= offered[n.host] for n in r.nodes) or claimed.intersection(devices):
            continue
        busy = {holder[d] for d in devices if d in holder}
        if busy and not busy <= set(r.victims):
            continue
        claimed.update(devices)
        (draining if busy else ready).append(r)
    return ready, draining, head


def schedule(queued: Iterable[QueuedJob], hosts: Iterable[Host], running: Iterable[Placement] = (), *,
             now: float | None = None, quotas: Mapping[str, Quota] | None = None, reservations: Iterable[Reservation] = (),
             min_runtime_s: float = DEFAULT_MIN_RUNTIME_S) -> Decision:
    """Place what fits now, and say for every other queued job where it stands and what holds it.

    ``running`` are the placements of the jobs that hold devices now; their GPUs and CPU slots are
    not free. Dead hosts get nothing. ``now`` is the time on the placements' clock (seconds);
    ``quotas`` maps owners to their quota (an owner not in it has no limit); ``reservations`` are
    those of the previous decision, handed back. Raises ValueError for duplicate job or host ids, or a
    job that is both queued and running.
    """
    jobs = sorted(queued, key=attrgetter("submitted_seq", "id"))
    jobs.sort(key=attrgetter("priority"), reverse=True)  # a stable sort: equal priorities keep that order
    running = list(running)
    hosts = list(hosts)
    quotas = dict(quotas or {})
    by_id = {j.id: j for j in jobs}
    if len(by_id) != len(jobs):
        raise ValueError("queued job ids must be distinct")
    both = by_id.keys() & {p.job_id for p in running}
    if both:
        raise ValueError(f"jobs both queued and running: {sorted(both)}")
    ready, draining, head = _carry(reservations, by_id, hosts, running)
    placements: list[Placement] = []
    special: dict[str, str] = {}  # job id -> its reason, for the jobs this pass decided about by name
    held = [Placement("", r.nodes) for r in draining]
    cluster = Cluster(hosts, running + held)
    usage = Usage(quotas, {j.owner for j in jobs} | {p.owner for p in running}, sum(cluster.gpu.totals), sum(cluster.cpu.totals), running)
    for r in ready:
        job = by_id[r.job_id]
        gpus = sum(len(n.gpus) for n in r.nodes)
        placements.append(Placement(job.id, r.nodes, **_meta(job, now, usage.borrows(job.owner, gpus, 0))))  # type: ignore[arg-type]
        usage.add(job.owner, gpus, 0)
        for n in r.nodes:
            cluster.claim(cluster.number[n.host], n.gpus)
    running_by_id = {p.job_id: p for p in running}
    stopping = {v for r in draining for v in r.victims if v in running_by_id}
    kept: list[Reservation] = []
    for r in draining:
        special[r.job_id] = reasons.preempting([running_by_id[v] for v in r.victims if v in running_by_id], draining=True)
        kept.append(r)
    start = Snapshot(cluster)

    preemptions: list[Preemption] = []
    hold: backfill.Hold | None = None
    if head is not None and now is not None:
        hosts_of = [cluster.number[n.host] for n in head.nodes]
        hold = backfill.plan(by_id[head.job_id], Need.of(by_id[head.job_id]), cluster, _holders(running, placements, stopping, cluster),
                             now, only=hosts_of)
    left: list[tuple[str, tuple, int]] = []  # (job id, its ask, jobs placed before it in this pass)
    needs: dict[tuple, Need] = {}
    # Free capacity only shrinks during a pass, so an ask that did not fit once does not fit again:
    # on a full cluster the tail of a long queue costs a set lookup per job.
    no_fit: set[tuple] = set()
    no_victims: set[tuple] = set()
    smallest_misfit = {"gpu": math.inf, "cpu": math.inf}  # single-node asks of at least this many fail
    done = set(special) | {r.job_id for r in ready}
    # The reservation goes to the blocked job of the highest priority submitted first (the order of
    # ``jobs``), whatever the fair-share order made the first one blocked: newer jobs of an owner that
    # uses less must not keep a large job from ever holding one. So it is planned once every job
    # before that one in ``jobs`` has had its turn.
    seen: set[str] = set(done)
    first = 0  # index in jobs of the first job not yet seen
    oldest: QueuedJob | None = None  # the oldest blocked job that may hold a reservation
    never: dict[tuple, bool] = {}

    def place(job: QueuedJob, need: Need, found: list[int]) -> None:
        if need.device == "cpu":
            gpus, cpu = 0, need.per_node * need.nnodes
        else:
            gpus, cpu = sum(len(cluster.free_gpus[h]) for h in found) if need.whole else need.per_node * need.nnodes, 0
        placements.append(cluster.place(job.id, need, found, **_meta(job, now, usage.borrows(job.owner, gpus, cpu))))
        usage.add(job.owner, gpus, cpu)

    def released() -> None:
        """GPUs came free in the middle of the pass: the jobs that waited for them get them first."""
        nonlocal oldest
        no_fit.clear()
        smallest_misfit.update(gpu=math.inf, cpu=math.inf)
        still = []
        for entry in left:
            job_id, ask, _ = entry
            found = None if job_id in special else cluster.find(needs[ask])
            if found is None:
                still.append(entry)
            else:
                place(by_id[job_id], needs[ask], found)
        left[:] = still
        if oldest is not None and all(e[0] != oldest.id for e in left):
            oldest = min((by_id[e[0]] for e in left if may_hold(e[0], e[1])), key=order_key, default=None)

    def may_hold(job_id: str, ask: tuple) -> bool:
        if ask[0] != "gpu" or job_id in special:
            return False
        need = needs[ask]
        if ask not in never:
            never[ask] = reasons.never(need, cluster) is not None
        return not never[ask] and not usage.borrows(by_id[job_id].owner, 0 if need.whole else need.per_node * need.nnodes, 0)

    def reserve() -> None:
        nonlocal first, hold, oldest
        while first < len(jobs) and jobs[first].id in seen:
            first += 1
        if hold is None and oldest is not None and (first == len(jobs) or order_key(jobs[first]) > order_key(oldest)):
            assert now is not None
            need = needs[(oldest.device, oldest.nnodes, oldest.nproc_per_node)]
            hold = backfill.plan(oldest, need, cluster, _holders(running, placements, stopping, cluster), now)
            if hold is not None:
                special[oldest.id] = reasons.reserved(need, hold.reservation, now)
            oldest = None

    def try_preempt(job: QueuedJob, need: Need, ask: tuple) -> bool:
        """Stop the cheapest set of running jobs this one may preempt so that it fits; it is placed on their
        GPUs once they have checkpointed and left (a reservation from a preemption)."""
        assert now is not None
        asked = need.per_node * need.nnodes if not need.whole else 0
        reclaims = usage.within_gpu_quota(job.owner, asked)
        key = (ask, job.priority, job.owner, reclaims)
        if key in no_victims:
            return False
        found_victims = _preempt(job, need, cluster, running, stopping, None if hold is not None and hold.job is job else hold,
                                 now, reclaims, quotas, min_runtime_s)
        if found_victims is None:
            no_victims.add(key)
            return False
        chosen = list(zip(found_victims.hosts, found_victims.gpus, strict=True))
        nodes = tuple(NodePlacement(rank, cluster.ids[h], g) for rank, (h, g) in enumerate(chosen))
        for h, g in chosen:
            cluster.claim(h, g)
        for v in found_victims.victims:
            stopping.add(v.job_id)
            preemptions.append(Preemption(v.job_id, job.id, reasons.preempted(job, reclaims, v)))
        kept.append(Reservation(job.id, nodes, now, tuple(v.job_id for v in found_victims.victims)))
        special[job.id] = reasons.preempting(found_victims.victims)
        left.append((job.id, ask, len(placements)))
        return True

    for job in fair_order([j for j in jobs if j.id not in done], usage):
        if now is not None:
            reserve()
            seen.add(job.id)
        ask = (job.device, job.nnodes, job.nproc_per_node)
        need = needs.get(ask)
        if need is None:
            need = needs[ask] = Need.of(job)
        if ask not in no_fit:
            single = need.nnodes == 1 and not need.whole
            found = None if single and need.per_node >= smallest_misfit[need.device] else cluster.find(need)
            if found is not None:
                place(job, need, found)
                if hold is not None and hold.job is job:
                    backfill.release(hold, cluster)
                    hold = None
                    released()
                continue
            no_fit.add(ask)
            if single:
                smallest_misfit[need.device] = min(smallest_misfit[need.device], need.per_node)
        if hold is not None and hold.job is job:
            gpus = sum(len(cluster.offered[h]) for h in hold.hosts) if need.whole else need.per_node * need.nnodes
            placed = backfill.take(hold, need, cluster, **_meta(job, now, usage.borrows(job.owner, gpus, 0)))
            if placed is not None:
                placements.append(placed)
                usage.add(job.owner, gpus, 0)
                hold = None
                released()
                continue
            own_hold = hold
            # The held hosts free up only when their jobs end: stopping jobs it may preempt is sooner.
            own = hold.free
            backfill.release(hold, cluster)
            hold = None
            if try_preempt(job, need, ask):
                released()
                continue
            hold = own_hold
            for h, free in own.items():
                cluster.claim(h, free)
            hold.free = own
            special[job.id] = reasons.reserved(need, hold.reservation, now)
            left.append((job.id, ask, len(placements)))
            continue
        if hold is not None and hold.sticky and job.priority > hold.job.priority and reasons.never(need, cluster) is None:
            backfill.release(hold, cluster)  # a blocked job of higher priority takes the reservation over
            hold = None
            released()
            found = cluster.find(need)
            if found is not None:
                place(job, need, found)
                continue
        if hold is not None:
            assert now is not None
            harmless = (job.timeout_s is not None and now + job.timeout_s <= hold.start) or preempt.may_preempt(
                hold.job, Placement(job.id, (), job.owner, job.priority, job.preemptible, now), hold.start,
                reclaims=False, quotas=quotas, min_runtime_s=min_runtime_s)
            gpus = need.per_node
            placed = backfill.place(hold, job, need, cluster, harmless, **_meta(job, now, usage.borrows(job.owner, gpus, 0)))
            if placed is not None:
                placements.append(placed)
                usage.add(job.owner, gpus, 0)
                continue
        if now is not None and need.device == "gpu":
            if try_preempt(job, need, ask):
                continue
            if (oldest is None or order_key(job) < order_key(oldest)) and may_hold(job.id, ask):
                oldest = job
        left.append((job.id, ask, len(placements)))
    if now is not None:
        reserve()

    if hold is not None:
        kept.append(hold.reservation)
    waiting: dict[str, Waiting] = {}
    for r in draining:
        waiting[r.job_id] = Waiting(len(waiting) + 1, special[r.job_id])
    reason_of: dict[tuple, str | None] = {}  # None: it fitted at the start, so the jobs ahead took it
    never_of: dict[tuple, str | None] = {}
    ahead: dict[int, str] = {}
    for job_id, ask, before in left:
        if job_id in special:
            waiting[job_id] = Waiting(len(waiting) + 1, special[job_id])
            continue
        job = by_id[job_id]
        need = needs[ask]
        if ask not in never_of:
            never_of[ask] = None if start.fits(need) else reasons.never(need, cluster)
        text = never_of[ask]
        quota = quotas.get(job.owner) if quotas else None
        if text is None and quota is not None and quota.gpus is not None and need.device == "gpu":
            used, asked = usage.gpus[job.owner], need.per_node * need.nnodes
            if used + asked > quota.gpus:
                text = reasons.over_quota(job.owner, used, quota.gpus)
        if text is None and hold is not None and backfill.fits_held(hold, need):
            text = reasons.behind(hold.job, hold.reservation, now)
        if text is None:
            if ask in reason_of:
                text = reason_of[ask]
            else:
                text = reason_of[ask] = None if start.fits(need) else reasons.capacity(need, cluster)
            if text is None:
                text = ahead.get(before) or ahead.setdefault(before, reasons.ahead(before))
        waiting[job_id] = Waiting(len(waiting) + 1, text)
    return Decision(tuple(placements), waiting, tuple(preemptions), tuple(kept))


def _preempt(job: QueuedJob, need: Need, cluster: Cluster, running: list[Placement], stopping: set[str], hold: backfill.Hold | None,
             now: float, reclaims: bool, quotas: dict[str, Quota], min_runtime_s: float) -> preempt.Victims | None:
    candidates: dict[int, list[tuple[Placement, int]]] = {}
    for p in running:
        if p.job_id in stopping or not p.gpu_count:
            continue
        if not preempt.may_preempt(job, p, now, reclaims=reclaims, quotas=quotas, min_runtime_s=min_runtime_s):
            continue
        for node in p.nodes:
            h = cluster.number.get(node.host)
            if h is not None and node.gpus:
                candidates.setdefault(h, []).append((p, len(node.gpus)))
    if not candidates:
        return None
    return preempt.find(need, cluster, candidates, set(hold.hosts) if hold else set())


def _holders(running: list[Placement], placed: list[Placement], stopping: set[str], cluster: Cluster) -> dict[int, list[tuple]]:
    """Per host number, (expected end, GPUs, *indices) of each placement that will free GPUs there."""
    out: dict[int, list[tuple]] = {}
    for p in running + placed:
        if p.job_id in stopping:
            continue  # its GPUs go to the job that preempts it
        end = p.expected_end()
        for node in p.nodes:
            h = cluster.number.get(node.host)
            if h is not None and node.gpus:
                out.setdefault(h, []).append((end, len(node.gpus), *node.gpus))
    return out
