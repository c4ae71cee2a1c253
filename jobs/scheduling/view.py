"""What the scheduler's pass reads from SQL, in one short transaction: live hosts, queued jobs with what
they ask, running placements with what preemption and quotas read of them, quotas, and each owner's
running-job count. The policy (jobs.scheduling) sees these as plain values; nothing here decides.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.hosts.registry import HOLDING, quarantined, read_hosts
from jobs.scheduling import NodePlacement, Placement, dependencies
from jobs.scheduling import Quota as PolicyQuota
from jobs.store.models import Attempt, Host, Job, Quota, Status
from jobspec.view import StoredSpec


@dataclass(frozen=True)
class QueuedRow:
    id: str
    owner: str
    queue: str
    attempt: int
    spec: dict[str, Any]
    position: int | None
    reason: str | None
    priority: int = 50
    preemptible: bool = True
    hold: str | None = None
    # Why it was last stopped to make room (the stop request, kept until it is placed again).
    preempted: str | None = None

    @property
    def timeout_s(self) -> float:
        return StoredSpec.of(self.spec).timeout_s

    @property
    def depends_on(self) -> tuple[str, ...]:
        return StoredSpec.of(self.spec).depends_on


@dataclass
class View:
    hosts: list[Host]
    queued: list[QueuedRow]
    running: list[Placement]
    per_owner: dict[str, int]
    quotas: dict[str, PolicyQuota] = field(default_factory=dict)
    # Running jobs already asked to make room (jobs/scheduling/stops.py): they hold their devices until they have left.
    stopping: set[str] = field(default_factory=set)
    # The status of every job a queued job depends on (jobs/scheduling/dependencies.py); a deleted one is absent.
    dependencies: dict[str, str] = field(default_factory=dict)
    # Per host id, its quarantined GPUs and why (jobs/hosts/states.py): never offered to the policy.
    quarantined: dict[str, dict[int, str]] = field(default_factory=dict)


def placement_of(job_id: str, nodes: list[dict[str, Any]], **meta: Any) -> Placement:
    return Placement(job_id, tuple(NodePlacement(n["node_rank"], n["host"], tuple(n.get("gpus") or ()), int(n.get("cpu_slots") or 0))
                                   for n in nodes), **meta)


def read_quotas(session: Session) -> dict[str, PolicyQuota]:
    return {q.owner: PolicyQuota(q.gpus, q.cpu_slots) for q in session.exec(sa.select(Quota)).scalars()}  # type: ignore[call-overload]


def read_view(session: Session, lease_ttl_s: float) -> View:
    hosts = [row.host for row in read_hosts(session, lease_ttl_s) if row.alive]
    queued = [QueuedRow(*row) for row in session.exec(  # type: ignore[call-overload]
        sa.select(Job.id, Job.owner, Job.queue, Job.attempt, Job.spec, Job.queue_position, Job.waiting_reason, Job.priority,
                  Job.preemptible, Job.hold, Job.stop_request)
        .where(Job.status == Status.QUEUED.value).order_by(Job.created_at, Job.id)).all()]
    running: list[Placement] = []
    per_owner: dict[str, int] = defaultdict(int)
    stopping: set[str] = set()
    rows = session.exec(sa.select(  # type: ignore[call-overload]
        Job.id, Job.owner, Job.placement, Job.priority, Job.preemptible, Job.borrowed, Job.spec, Job.stop_request,
        Job.status, Attempt.started_at)
        .outerjoin(Attempt, sa.and_(Attempt.job_id == Job.id, Attempt.attempt == Job.attempt))  # type: ignore[arg-type]
        .where(Job.status.in_(HOLDING))).all()  # type: ignore[attr-defined]
    for job_id, owner, placement, priority, preemptible, borrowed, spec, stop_request, status, started in rows:
        per_owner[owner] += 1
        if stop_request or status != Status.RUNNING.value:
            stopping.add(job_id)
        if placement:
            running.append(placement_of(
                job_id, placement, owner=owner, priority=priority, borrowed=borrowed,
                # One already on its way out stays a candidate: choosing it again asks nothing more of it.
                preemptible=preemptible,
                started_at=started.timestamp() if started is not None else None,
                timeout_s=StoredSpec.of(spec).timeout_s))
    quotas = read_quotas(session)
    depends = dependencies.statuses(session, (dep for job in queued for dep in job.depends_on))
    bad = quarantined(session)
    session.commit()
    return View(hosts, queued, running, dict(per_owner), quotas, stopping, depends, bad)
