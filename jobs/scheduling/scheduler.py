"""The scheduler's pass: read queued jobs, live hosts and running placements from SQL, ask the policy
(``jobs.scheduling.schedule``), write each placement with the job's move to running in one transaction,
then hand each node's task to its host through RQ (one queue per host, ``host:<id>``).

One pass at a time: whichever process holds the ``scheduler`` lease (jobs/scheduling/leader.py) runs it, and every
write carries that lease, so a leader that lost it mid-pass writes nothing more. SQL is the truth: a task
lost with Redis leaves a running job whose attempt nobody adopted; its lease lapses and the reconciler
puts it back in line, and a job placed twice is impossible (the move from queued is a guarded transition).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from sqlmodel import Session

from jobs.hosts import states as host_states
from jobs.infra.clock import db_now
from jobs.scheduling import (
    DEFAULT_MIN_RUNTIME_S,
    Decision,
    NodePlacement,
    Placement,
    Preemption,
    QueuedJob,
    Reservation,
    Waiting,
    dependencies,
    leader,
    schedule,
    stops,
)
from jobs.scheduling import Host as PolicyHost
from jobs.scheduling.lease_loop import LeaseLoop
from jobs.scheduling.reasons import unavailable
from jobs.scheduling.view import QueuedRow, View, read_view
from jobs.settings import Settings
from jobs.store.models import Attempt, ErrorType, Job, Status, utcnow
from jobs.store.states import TransitionRefused, transition
from jobspec.view import StoredSpec

log = logging.getLogger(__name__)

# What a host's worker runs for each node task it pops (worker/host_runner.py).
NODE_TASK = "worker.supervisor.run_node"
RESULT_TTL_S = 3600


# A submission pushes here; the leader's loop waits on it instead of sleeping, so a pass follows a submission at once.
NUDGE_KEY = "torchyard:scheduler:nudge"


def nudge(redis: Redis) -> None:
    """Ask for a pass now; without Redis the next timed pass (TORCHYARD_POLL_INTERVAL_S) places the job anyway."""
    try:
        redis.pipeline(transaction=False).lpush(NUDGE_KEY, 1).ltrim(NUDGE_KEY, 0, 0).expire(NUDGE_KEY, 60).execute()
    except RedisError:
        log.debug("scheduler: could not nudge; the next timed pass places the job")


def host_queue(host_id: str) -> str:
    return f"host:{host_id}"


def task_id(job_id: str, attempt: int, node_rank: int) -> str:
    return f"{job_id}-a{attempt}-n{node_rank}"


@dataclass
class PassReport:
    placed: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    waiting: int = 0
    lost_lease: bool = False
    # Devices held for waiting jobs: handed to the next pass (jobs.scheduling.Reservation).
    reservations: tuple[Reservation, ...] = ()


def _ask(spec: dict[str, Any], gpu_hosts: bool) -> tuple[str, int, int | str]:
    """(device, nnodes, nproc_per_node) as the policy reads them; device auto is a GPU job where hosts have GPUs."""
    stored = StoredSpec.of(spec)
    gpu = stored.device == "cuda" or stored.nproc_per_node == "gpu" or (stored.device == "auto" and gpu_hosts)
    return ("gpu" if gpu else "cpu"), stored.nnodes, stored.nproc_per_node


def decide(view: View, running_cap: int, *, now: float | None = None, reservations: Iterable[Reservation] = (),
           min_runtime_s: float = DEFAULT_MIN_RUNTIME_S) -> Decision:
    """The whole pass's decision: per queue, the policy over the live hosts that serve it; held jobs and jobs of an
    owner at the running-job cap wait with that reason. Slurm hosts take every job of their queues in order (Slurm
    places ranks). With ``now`` the policy also preempts, reclaims quota and reserves hosts (jobs.scheduling.policy)."""
    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    kept: list[Reservation] = []
    waiting: dict[str, Waiting] = {}
    per_owner = view.per_owner
    allowance = {owner: running_cap - n for owner, n in per_owner.items()}
    reservations = list(reservations)

    def capped(owner: str) -> Waiting:
        running_now = per_owner.get(owner, 0)
        ahead = running_cap - running_now
        return Waiting(0, f"over the owner's running-job cap: {running_now} running"
                          f"{f' and {ahead} placed ahead of it' if ahead > 0 else ''}, the cap is {running_cap}")

    by_queue: dict[str, list[QueuedRow]] = defaultdict(list)
    for job in view.queued:
        if job.hold:
            waiting[job.id] = Waiting(0, job.hold)
        elif job.depends_on and (after := dependencies.verdict(job.depends_on, view.dependencies)).kind != "ready":
            waiting[job.id] = Waiting(0, after.reason)  # a failed dependency's job is ended by run_pass
        elif allowance.setdefault(job.owner, running_cap) <= 0:
            waiting[job.id] = capped(job.owner)
        else:
            by_queue[job.queue].append(job)
    held = list(view.running)
    for queue_name in sorted(by_queue):
        jobs = by_queue[queue_name]
        serving = [h for h in view.hosts if queue_name in h.queues]
        # A draining host gets nothing new; a quarantined GPU is never offered (jobs/hosts/states.py).
        drained = [(h.id, h.drain_reason) for h in serving if h.drain_reason is not None]
        serving = [h for h in serving if h.drain_reason is None]
        bad = [(h.id, len(set(view.quarantined.get(h.id, {})) & set(h.gpus))) for h in serving]
        slurm = [h for h in serving if h.executor == "slurm"]
        local = [h for h in serving if h.executor != "slurm"]
        if slurm:
            for i, job in enumerate(jobs):
                if allowance[job.owner] <= 0:
                    waiting[job.id] = capped(job.owner)
                    continue
                allowance[job.owner] -= 1
                placements.append(Placement(job.id, (NodePlacement(0, slurm[i % len(slurm)].id),)))
            continue
        if not local:
            out = unavailable(drained, ())
            for i, job in enumerate(jobs):
                waiting[job.id] = Waiting(i + 1, f"no live host serves queue {queue_name}" + (f"; {out}" if out else ""))
            continue
        gpu_hosts = any(h.gpus for h in local)
        asks = {}
        for seq, job in enumerate(jobs):
            device, nnodes, nproc = _ask(job.spec, gpu_hosts)
            asks[job.id] = QueuedJob(job.id, job.owner, nnodes=nnodes, nproc_per_node=nproc, device=device,  # type: ignore[arg-type]
                                     submitted_seq=seq, priority=job.priority, timeout_s=job.timeout_s,
                                     preemptible=job.preemptible)
        pool = [PolicyHost(id=h.id, gpus=tuple(h.gpus), cpu_slots=h.cpu_slots,
                           free_gpus=tuple(g for g in h.gpus if g not in view.quarantined.get(h.id, {}))) for h in local]
        mine = [r for r in reservations if r.job_id in asks]
        # Placements on hosts outside the pool are passed over.
        decision = schedule(asks.values(), pool, held, now=now, quotas=view.quotas, reservations=mine, min_runtime_s=min_runtime_s)
        waiting.update(decision.waiting)
        for job_id, w in decision.waiting.items():  # say what is out of placement where it could be why
            if out := unavailable(drained, bad if asks[job_id].device == "gpu" else ()):
                waiting[job_id] = Waiting(w.position, f"{w.reason}; {out}")
        preemptions.extend(p for p in decision.preemptions if p.victim_job_id not in view.stopping)
        kept.extend(decision.reservations)
        for placement in decision.placements:
            owner = asks[placement.job_id].owner
            if allowance[owner] <= 0:  # the owner's cap filled up within this pass: the next pass reconsiders it
                waiting[placement.job_id] = capped(owner)
                continue
            allowance[owner] -= 1
            placements.append(placement)
            held.append(placement)
    for job in view.queued:  # a job stopped to make room says so until it runs again
        if job.preempted and job.id in waiting and not waiting[job.id].reason.startswith(job.preempted):
            waiting[job.id] = Waiting(waiting[job.id].position, f"{job.preempted}; now {waiting[job.id].reason}")
    return Decision(tuple(placements), waiting, tuple(preemptions), tuple(kept))


def nodes_json(placement: Placement) -> list[dict[str, Any]]:
    return [{"node_rank": n.node_rank, "host": n.host, "gpus": list(n.gpus), "cpu_slots": n.cpu_slots}
            for n in sorted(placement.nodes, key=lambda n: n.node_rank)]


def run_pass(session: Session, redis: Redis, settings: Settings, holder: str, *,
             reservations: Iterable[Reservation] = (), now: float | None = None) -> PassReport:
    """One pass, as the lease holder ``holder``; stops at the first write that finds the lease gone. ``reservations``:
    those of the previous pass (PassReport.reservations)."""
    report = PassReport()
    view = read_view(session, settings.lease_ttl_s)
    if not _end_jobs_whose_dependency_failed(session, settings, holder, view):
        report.lost_lease = True
        return report
    if not _stop_jobs_on_draining_hosts(session, settings, holder, view):
        report.lost_lease = True
        return report
    if not view.queued:
        return report
    decision = decide(view, settings.max_running_per_owner, now=time.time() if now is None else now,
                      reservations=reservations, min_runtime_s=settings.preempt_min_runtime_s)
    report.reservations = decision.reservations
    attempts = {j.id: j.attempt for j in view.queued}
    handed: list[tuple[Placement, int]] = []
    for placement in decision.placements:
        placed = _place(session, settings, holder, placement, attempts[placement.job_id])
        if placed is None:
            report.lost_lease = True
            return report
        if placed:
            handed.append((placement, attempts[placement.job_id]))
            report.placed.append(placement.job_id)
    for placement, attempt in handed:
        hand_over(redis, placement, attempt)
    for preemption in decision.preemptions:
        if not leader.still_held(session, leader.SCHEDULER, holder, settings.lease_ttl_s):
            session.rollback()
            report.lost_lease = True
            return report
        if stops.request_stop(session, preemption.victim_job_id, reason=preemption.reason):
            log.info("scheduler: job %s is asked to checkpoint and make room for job %s", preemption.victim_job_id,
                     preemption.by_job_id, extra={"job_id": preemption.victim_job_id})
            report.preempted.append(preemption.victim_job_id)
    report.waiting = len(decision.waiting)
    if not _store_waiting(session, settings, holder, view.queued, decision.waiting):
        report.lost_lease = True
    return report


def _end_jobs_whose_dependency_failed(session: Session, settings: Settings, holder: str, view: View) -> bool:
    """Cancel each queued job one of whose dependencies ended failed, cancelled or was deleted (it can never run),
    and take it out of ``view``. False: the lease is gone."""
    ended = set()
    for job in view.queued:
        after = dependencies.verdict(job.depends_on, view.dependencies) if job.depends_on else None
        if after is None or after.kind != "fail":
            continue
        if not leader.still_held(session, leader.SCHEDULER, holder, settings.lease_ttl_s):
            session.rollback()
            return False
        try:
            transition(session, job.id, Status.CANCELLED, expect=[Status.QUEUED], reason=after.reason, values={
                "error_type": ErrorType.DEPENDENCY_FAILED.value, "error_message": f"{after.reason}, so this job never ran",
                "queue_position": None, "waiting_reason": None})
        except TransitionRefused:
            continue  # it moved on meanwhile (cancelled by its owner)
        ended.add(job.id)
    view.queued[:] = [job for job in view.queued if job.id not in ended]
    return True


def _stop_jobs_on_draining_hosts(session: Session, settings: Settings, holder: str, view: View) -> bool:
    """A job placed on a host by a pass that read it before its drain is asked to make room too. False: the lease
    is gone."""
    drains = {h.id: h.drain_reason for h in view.hosts if h.drain_reason is not None}
    for placement in view.running:
        host = next((n.host for n in placement.nodes if n.host in drains), None)
        if host is None or placement.job_id in view.stopping:
            continue
        if not leader.still_held(session, leader.SCHEDULER, holder, settings.lease_ttl_s):
            session.rollback()
            return False
        if stops.request_stop(session, placement.job_id, reason=host_states.drain_stop_reason(host, drains[host] or "")):
            view.stopping.add(placement.job_id)
    return True


def _place(session: Session, settings: Settings, holder: str, placement: Placement, attempt: int) -> bool | None:
    """Write one placement with the job's move to running, in one transaction. None: the lease is gone; False: the
    job moved on meanwhile (cancelled, or placed by a leader before us)."""
    nodes = nodes_json(placement)
    if not leader.still_held(session, leader.SCHEDULER, holder, settings.lease_ttl_s):
        session.rollback()
        return None
    session.merge(Attempt(job_id=placement.job_id, attempt=attempt, worker_id=None, started_at=utcnow(), placement=nodes))
    where = ", ".join(f"{n['host']}" + (f" GPUs {','.join(map(str, n['gpus']))}" if n["gpus"] else "") for n in nodes)
    try:
        transition(session, placement.job_id, Status.RUNNING, expect=[Status.QUEUED], reason=f"placed on {where}",
                   guard=[Job.attempt == attempt], values={
                       "worker_id": nodes[0]["host"], "placement": nodes, "queue_position": None, "waiting_reason": None,
                       "borrowed": placement.borrowed, "stop_request": None,
                       # The attempt's lease starts now: a task nobody adopts lapses and goes back in line.
                       "lease_expires_at": db_now(session, settings.lease_ttl_s),
                       "started_at": sa.func.coalesce(Job.started_at, utcnow()),
                   })
    except TransitionRefused:
        return False
    return True


def hand_over(redis: Redis, placement: Placement, attempt: int) -> None:
    """Each node's task to its host's queue; a failure is logged: the unadopted attempt lapses and is placed again."""
    for node in placement.nodes:
        try:
            Queue(host_queue(node.host), connection=redis).enqueue(
                NODE_TASK, placement.job_id, attempt, node.node_rank, job_id=task_id(placement.job_id, attempt, node.node_rank),
                job_timeout=-1, result_ttl=RESULT_TTL_S, failure_ttl=RESULT_TTL_S,
                description=f"torchyard job {placement.job_id} attempt {attempt} node {node.node_rank}")
        except RedisError as exc:
            log.warning("job %s: could not hand node %d to host %s (%s); it is placed again once its lease lapses",
                        placement.job_id, node.node_rank, node.host, exc, extra={"job_id": placement.job_id})


def _store_waiting(session: Session, settings: Settings, holder: str, queued: Iterable[QueuedRow],
                   waiting: dict[str, Waiting]) -> bool:
    """Store each waiting job's position (0-based) and reason where they changed, so reading a queued job asks nothing
    else. False: the lease is gone."""
    changed = []
    for job in queued:
        w = waiting.get(job.id)
        if w is None:
            continue
        position = w.position - 1 if w.position > 0 else None
        if (position, w.reason) != (job.position, job.reason):
            changed.append({"jid": job.id, "pos": position, "why": w.reason})
    if not changed:
        return True
    if not leader.still_held(session, leader.SCHEDULER, holder, settings.lease_ttl_s):
        session.rollback()
        return False
    table = Job.__table__  # type: ignore[attr-defined]
    # Core, not the ORM: one executemany of every changed row.
    session.connection().execute(sa.update(table).where(table.c.id == sa.bindparam("jid"), table.c.status == Status.QUEUED.value)
                                 .values(queue_position=sa.bindparam("pos"), waiting_reason=sa.bindparam("why")), changed)
    session.commit()
    return True


def nudge_wait_s(left_s: float) -> float:
    """BLPOP's timeout for a wait with ``left_s`` seconds to go: at most a second, so that a stopped loop lets go of
    the connection (and of nudges) soon, and at least 10 ms: Redis 6 reads a timeout under 1 ms as 0, which blocks
    until the next nudge, so a pass that left the loop a few microseconds to wait stopped scheduling until a job
    was submitted."""
    return min(max(left_s, 0.01), 1.0)


class SchedulerLoop(LeaseLoop):
    """Runs in every worker process: the one holding the lease passes every ``interval_s``, or at once after a
    submission's nudge; the others stand by."""

    def __init__(self, settings: Settings, holder: str, redis: Redis, interval_s: float | None = None):
        super().__init__(settings, leader.SCHEDULER, holder,
                         interval_s if interval_s is not None else settings.poll_interval_s, what="scheduler")
        self.redis = redis
        self.reservations: tuple[Reservation, ...] = ()

    def wait(self) -> None:
        """Until the next pass: a nudge (a submission) or the interval, whichever comes first. Only the leader
        listens, so the nudge reaches the process that passes."""
        deadline = time.monotonic() + self.interval_s
        while self.leading and not self.stopped.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                if self.redis.blpop([NUDGE_KEY], timeout=nudge_wait_s(left)) is not None:
                    return
            except RedisError:
                break
        self.stopped.wait(max(0.0, deadline - time.monotonic()))

    def lead_changed(self) -> None:
        self.reservations = ()  # a new leader plans afresh; running jobs asked to stop stay asked

    def lead(self, session: Session) -> None:
        started = time.monotonic()
        report = run_pass(session, self.redis, self.settings, self.holder, reservations=self.reservations)
        self.reservations = report.reservations
        if report.placed:
            log.info("scheduler: placed %d job(s) in %.0f ms; %d waiting", len(report.placed),
                     1000 * (time.monotonic() - started), report.waiting)


def queued_in_order(session: Session, owner: str | None, limit: int = 1000) -> list[dict[str, Any]]:
    """Queued jobs in the order the scheduler considers them (by queue, then its stored position; jobs it has not
    looked at yet last, oldest first), each with its reason. ``owner`` None: every owner's (the admin)."""
    query = (sa.select(Job.id, Job.name, Job.owner, Job.queue, Job.queue_position, Job.waiting_reason, Job.created_at, Job.spec)
             .where(Job.status == Status.QUEUED.value)
             .order_by(Job.queue, Job.queue_position.is_(None), Job.queue_position, Job.created_at, Job.id)  # type: ignore[union-attr]
             .limit(limit))
    if owner is not None:
        query = query.where(Job.owner == owner)
    rows = session.exec(query).all()  # type: ignore[call-overload]
    session.commit()
    items = []
    for job_id, name, job_owner, queue_name, position, reason, created_at, spec in rows:
        stored = StoredSpec.of(spec)
        items.append({"id": job_id, "name": name, "owner": job_owner, "queue": queue_name, "queue_position": position,
                      "waiting_reason": reason, "created_at": created_at, "nnodes": stored.nnodes,
                      "nproc_per_node": stored.nproc_per_node, "device": stored.device})
    return items
