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

    One pass, as steps: order the queue; honour the reservations handed back (place those whose
    victims have left, hold the GPUs of those still draining); then each job in fair-share order is
    placed where it fits, or on its own reservation, or backfilled around the head's reservation,
    or makes room by preemption, or waits (the oldest blocked one getting a reservation); last,
    every job left waiting is told why.
    """
    jobs = _order(queued)
    running = list(running)
    p = _Pass(jobs, list(hosts), running, now, dict(quotas or {}), min_runtime_s, reservations)
    for job in fair_order([j for j in jobs if j.id not in p.done], p.usage):
        p.consider(job)
    if now is not None:
        p.reserve()
    return p.explain()


def _order(queued: Iterable[QueuedJob]) -> list[QueuedJob]:
    """Priority first, then submission; a stable sort keeps equal priorities in submission order."""
    jobs = sorted(queued, key=attrgetter("submitted_seq", "id"))
    jobs.sort(key=attrgetter("priority"), reverse=True)
    if len({j.id for j in jobs}) != len(jobs):
        raise ValueError("queued job ids must be distinct")
    return jobs


class _Pass:
    """The state of one pass: the cluster as this pass has claimed it, what it decided so far, and the
    memos that keep a long queue on a full cluster cheap. Each method is one step of the policy."""

    def __init__(self, jobs: list[QueuedJob], hosts: list[Host], running: list[Placement], now: float | None,
                 quotas: dict[str, Quota], min_runtime_s: float, reservations: Iterable[Reservation]):
        self.jobs, self.running, self.now, self.quotas, self.min_runtime_s = jobs, running, now, quotas, min_runtime_s
        self.by_id = {j.id: j for j in jobs}
        both = self.by_id.keys() & {p.job_id for p in running}
        if both:
            raise ValueError(f"jobs both queued and running: {sorted(both)}")
        ready, self.draining, head = _carry(reservations, self.by_id, hosts, running)
        self.placements: list[Placement] = []
        self.special: dict[str, str] = {}  # job id -> its reason, for the jobs this pass decided about by name
        self.preemptions: list[Preemption] = []
        self.kept: list[Reservation] = []  # the reservations handed to the next pass
        self.left: list[tuple[str, tuple, int]] = []  # waiting: (job id, its ask, jobs placed before it in this pass)
        self.needs: dict[tuple, Need] = {}
        # Free capacity only shrinks during a pass, so an ask that did not fit once does not fit again:
        # on a full cluster the tail of a long queue costs a set lookup per job.
        self.no_fit: set[tuple] = set()
        self.no_victims: set[tuple] = set()
        self.smallest_misfit = {"gpu": math.inf, "cpu": math.inf}  # single-node asks of at least this many fail
        self.never: dict[tuple, bool] = {}
        self.cluster = Cluster(hosts, running + [Placement("", r.nodes) for r in self.draining])
        self.usage = Usage(quotas, {j.owner for j in jobs} | {p.owner for p in running}, sum(self.cluster.gpu.totals),
                           sum(self.cluster.cpu.totals), running)
        self._take_ready(ready)
        running_by_id = {p.job_id: p for p in running}
        self.stopping = {v for r in self.draining for v in r.victims if v in running_by_id}
        for r in self.draining:
            self.special[r.job_id] = reasons.preempting([running_by_id[v] for v in r.victims if v in running_by_id], draining=True)
            self.kept.append(r)
        self.start = Snapshot(self.cluster)
        self.hold: backfill.Hold | None = None
        if head is not None and now is not None:
            job = self.by_id[head.job_id]
            self.hold = backfill.plan(job, Need.of(job), self.cluster, self._holders(), now,
                                      only=[self.cluster.number[n.host] for n in head.nodes])
        self.done = set(self.special) | {r.job_id for r in ready}
        # The reservation goes to the blocked job of the highest priority submitted first (the order of
        # ``jobs``), whatever the fair-share order made the first one blocked: newer jobs of an owner that
        # uses less must not keep a large job from ever holding one. So it is planned once every job
        # before that one in ``jobs`` has had its turn.
        self.seen: set[str] = set(self.done)
        self.first = 0  # index in jobs of the first job not yet seen
        self.oldest: QueuedJob | None = None  # the oldest blocked job that may hold a reservation

    # -- reservations handed back ------------------------------------------------------------------

    def _take_ready(self, ready: list[Reservation]) -> None:
        """A preemption's victims have left: its job goes on exactly the GPUs held for it."""
        for r in ready:
            job = self.by_id[r.job_id]
            gpus = sum(len(n.gpus) for n in r.nodes)
            self.placements.append(Placement(job.id, r.nodes, **self._meta(job, gpus, 0)))  # type: ignore[arg-type]
            self.usage.add(job.owner, gpus, 0)
            for n in r.nodes:
                self.cluster.claim(self.cluster.number[n.host], n.gpus)

    # -- one job -----------------------------------------------------------------------------------

    def consider(self, job: QueuedJob) -> None:
        """Place ``job``, or record why it waits: fit, its own reservation, a take-over, backfill, preemption."""
        if self.now is not None:
            self.reserve()
            self.seen.add(job.id)
        ask = (job.device, job.nnodes, job.nproc_per_node)
        need = self.needs.get(ask)
        if need is None:
            need = self.needs[ask] = Need.of(job)
        if self._fit(job, need, ask):
            return
        if self.hold is not None and self.hold.job is job:
            self._use_own_hold(job, need, ask)
            return
        if self._take_over(job, need) or self._backfill(job, need):
            return
        if self.now is not None and need.device == "gpu":
            if self._preempt(job, need, ask):
                return
            if (self.oldest is None or order_key(job) < order_key(self.oldest)) and self._may_hold(job.id, ask):
                self.oldest = job
        self.left.append((job.id, ask, len(self.placements)))

    def _fit(self, job: QueuedJob, need: Need, ask: tuple) -> bool:
        """The best fit that holds it now, if any."""
        if ask in self.no_fit:
            return False
        single = need.nnodes == 1 and not need.whole
        found = None if single and need.per_node >= self.smallest_misfit[need.device] else self.cluster.find(need)
        if found is not None:
            self._place(job, need, found)
            if self.hold is not None and self.hold.job is job:
                self._drop_hold()
            return True
        self.no_fit.add(ask)
        if single:
            self.smallest_misfit[need.device] = min(self.smallest_misfit[need.device], need.per_node)
        return False

    def _use_own_hold(self, job: QueuedJob, need: Need, ask: tuple) -> None:
        """The reserved job itself: on its held hosts if they hold it now, else by preemption, else it keeps waiting."""
        hold = self.hold
        assert hold is not None and self.now is not None
        gpus = sum(len(self.cluster.offered[h]) for h in hold.hosts) if need.whole else need.per_node * need.nnodes
        placed = backfill.take(hold, need, self.cluster, **self._meta(job, gpus, 0))
        if placed is not None:
            self.placements.append(placed)
            self.usage.add(job.owner, gpus, 0)
            self.hold = None
            self._released()
            return
        # The held hosts free up only when their jobs end: stopping jobs it may preempt is sooner.
        own = hold.free
        backfill.release(hold, self.cluster)
        self.hold = None
        if self._preempt(job, need, ask):
            self._released()
            return
        self.hold = hold
        for h, free in own.items():
            self.cluster.claim(h, free)
        hold.free = own
        self.special[job.id] = reasons.reserved(need, hold.reservation, self.now)
        self.left.append((job.id, ask, len(self.placements)))

    def _take_over(self, job: QueuedJob, need: Need) -> bool:
        """A blocked job of higher priority takes over a reservation handed back from the pass before."""
        hold = self.hold
        if hold is None or not hold.sticky or job.priority <= hold.job.priority or reasons.never(need, self.cluster) is not None:
            return False
        self._drop_hold()
        found = self.cluster.find(need)
        if found is None:
            return False
        self._place(job, need, found)
        return True

    def _backfill(self, job: QueuedJob, need: Need) -> bool:
        """Around the head's reservation, where this job cannot delay it."""
        hold = self.hold
        if hold is None:
            return False
        assert self.now is not None
        harmless = (job.timeout_s is not None and self.now + job.timeout_s <= hold.start) or preempt.may_preempt(
            hold.job, Placement(job.id, (), job.owner, job.priority, job.preemptible, self.now), hold.start,
            reclaims=False, quotas=self.quotas, min_runtime_s=self.min_runtime_s)
        placed = backfill.place(hold, job, need, self.cluster, harmless, **self._meta(job, need.per_node, 0))
        if placed is None:
            return False
        self.placements.append(placed)
        self.usage.add(job.owner, need.per_node, 0)
        return True

    def _preempt(self, job: QueuedJob, need: Need, ask: tuple) -> bool:
        """Stop the cheapest set of running jobs this one may preempt so that it fits; it is placed on their
        GPUs once they have checkpointed and left (a reservation from a preemption)."""
        now = self.now
        assert now is not None
        asked = need.per_node * need.nnodes if not need.whole else 0
        reclaims = self.usage.within_gpu_quota(job.owner, asked)
        key = (ask, job.priority, job.owner, reclaims)
        if key in self.no_victims:
            return False
        hold = None if self.hold is not None and self.hold.job is job else self.hold
        found = preempt.victims(job, need, self.cluster, self.running, self.stopping, set(hold.hosts) if hold else set(), now,
                               reclaims=reclaims, quotas=self.quotas, min_runtime_s=self.min_runtime_s)
        if found is None:
            self.no_victims.add(key)
            return False
        chosen = list(zip(found.hosts, found.gpus, strict=True))
        nodes = tuple(NodePlacement(rank, self.cluster.ids[h], g) for rank, (h, g) in enumerate(chosen))
        for h, g in chosen:
            self.cluster.claim(h, g)
        for v in found.victims:
            self.stopping.add(v.job_id)
            self.preemptions.append(Preemption(v.job_id, job.id, reasons.preempted(job, reclaims, v)))
        self.kept.append(Reservation(job.id, nodes, now, tuple(v.job_id for v in found.victims)))
        self.special[job.id] = reasons.preempting(found.victims)
        self.left.append((job.id, ask, len(self.placements)))
        return True

    # -- the backfill reservation ------------------------------------------------------------------

    def reserve(self) -> None:
        """Once every job ahead of the oldest blocked one has had its turn, that one gets a reservation."""
        while self.first < len(self.jobs) and self.jobs[self.first].id in self.seen:
            self.first += 1
        oldest = self.oldest
        if self.hold is not None or oldest is None:
            return
        if self.first == len(self.jobs) or order_key(self.jobs[self.first]) > order_key(oldest):
            assert self.now is not None
            need = self.needs[(oldest.device, oldest.nnodes, oldest.nproc_per_node)]
            self.hold = backfill.plan(oldest, need, self.cluster, self._holders(), self.now)
            if self.hold is not None:
                self.special[oldest.id] = reasons.reserved(need, self.hold.reservation, self.now)
            self.oldest = None

    def _may_hold(self, job_id: str, ask: tuple) -> bool:
        if ask[0] != "gpu" or job_id in self.special:
            return False
        need = self.needs[ask]
        if ask not in self.never:
            self.never[ask] = reasons.never(need, self.cluster) is not None
        gpus = 0 if need.whole else need.per_node * need.nnodes
        return not self.never[ask] and not self.usage.borrows(self.by_id[job_id].owner, gpus, 0)

    def _drop_hold(self) -> None:
        assert self.hold is not None
        backfill.release(self.hold, self.cluster)
        self.hold = None
        self._released()

    def _released(self) -> None:
        """GPUs came free in the middle of the pass: the jobs that waited for them get them first."""
        self.no_fit.clear()
        self.smallest_misfit.update(gpu=math.inf, cpu=math.inf)
        still = []
        for entry in self.left:
            job_id, ask, _ = entry
            found = None if job_id in self.special else self.cluster.find(self.needs[ask])
            if found is None:
                still.append(entry)
            else:
                self._place(self.by_id[job_id], self.needs[ask], found)
        self.left[:] = still
        if self.oldest is not None and all(e[0] != self.oldest.id for e in self.left):
            self.oldest = min((self.by_id[e[0]] for e in self.left if self._may_hold(e[0], e[1])), key=order_key, default=None)

    # -- placing and explaining --------------------------------------------------------------------

    def _place(self, job: QueuedJob, need: Need, found: list[int]) -> None:
        if need.device == "cpu":
            gpus, cpu = 0, need.per_node * need.nnodes
        else:
            gpus, cpu = sum(len(self.cluster.free_gpus[h]) for h in found) if need.whole else need.per_node * need.nnodes, 0
        self.placements.append(self.cluster.place(job.id, need, found, **self._meta(job, gpus, cpu)))
        self.usage.add(job.owner, gpus, cpu)

    def _meta(self, job: QueuedJob, gpus: int, cpu: int) -> dict[str, object]:
        return {"owner": job.owner, "priority": job.priority, "preemptible": job.preemptible, "started_at": self.now,
                "timeout_s": job.timeout_s, "borrowed": self.usage.borrows(job.owner, gpus, cpu)}

    def _holders(self) -> dict[int, list[tuple]]:
        """Per host number, (expected end, GPUs, *indices) of each placement that will free GPUs there."""
        out: dict[int, list[tuple]] = {}
        for p in self.running + self.placements:
            if p.job_id in self.stopping:
                continue  # its GPUs go to the job that preempts it
            end = p.expected_end()
            for node in p.nodes:
                h = self.cluster.number.get(node.host)
                if h is not None and node.gpus:
                    out.setdefault(h, []).append((end, len(node.gpus), *node.gpus))
        return out

    def explain(self) -> Decision:
        """The decision, with each waiting job's place in line and the reason it waits."""
        if self.hold is not None:
            self.kept.append(self.hold.reservation)
        waiting: dict[str, Waiting] = {}
        for r in self.draining:
            waiting[r.job_id] = Waiting(len(waiting) + 1, self.special[r.job_id])
        reason_of: dict[tuple, str | None] = {}  # None: it fitted at the start, so the jobs ahead took it
        never_of: dict[tuple, str | None] = {}
        ahead: dict[int, str] = {}
        for job_id, ask, before in self.left:
            if job_id in self.special:
                waiting[job_id] = Waiting(len(waiting) + 1, self.special[job_id])
                continue
            need = self.needs[ask]
            if ask not in never_of:
                never_of[ask] = None if self.start.fits(need) else reasons.never(need, self.cluster)
            text = never_of[ask] or self._over_quota(self.by_id[job_id], need)
            if text is None and self.hold is not None and backfill.fits_held(self.hold, need):
                text = reasons.behind(self.hold.job, self.hold.reservation, self.now)
            if text is None:
                if ask not in reason_of:
                    reason_of[ask] = None if self.start.fits(need) else reasons.capacity(need, self.cluster)
                text = reason_of[ask] or ahead.get(before) or ahead.setdefault(before, reasons.ahead(before))
            waiting[job_id] = Waiting(len(waiting) + 1, text)
        return Decision(tuple(self.placements), waiting, tuple(self.preemptions), tuple(self.kept))

    def _over_quota(self, job: QueuedJob, need: Need) -> str | None:
        quota = self.quotas.get(job.owner)
        if quota is None or quota.gpus is None or need.device != "gpu":
            return None
        used, asked = self.usage.gpus[job.owner], need.per_node * need.nnodes
        return reasons.over_quota(job.owner, used, quota.gpus) if used + asked > quota.gpus else None
