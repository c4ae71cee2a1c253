"""Owners' quotas: what each may hold with a guarantee (GPUs, CPU slots), and what each holds now.

Within its quota an owner's jobs are placed before others' borrowed devices are kept: the scheduler
takes borrowed devices back by preemption (jobs.scheduling.preempt). No row: no limit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import sqlalchemy as sa
from sqlmodel import Session

from jobs.hosts.registry import HOLDING
from jobs.scheduling.view import placement_of
from jobs.store.models import Job, Quota, utcnow


@dataclass(frozen=True)
class QuotaUse:
    owner: str
    gpus: int | None
    cpu_slots: int | None
    gpus_used: int
    cpu_slots_used: int
    gpus_borrowed: int


def set_quota(session: Session, owner: str, gpus: int | None, cpu_slots: int | None) -> Quota:
    row = session.get(Quota, owner) or Quota(owner=owner)
    row.gpus, row.cpu_slots, row.updated_at = gpus, cpu_slots, utcnow()
    session.add(row)
    session.commit()
    session.refresh(row)
    return row


def delete_quota(session: Session, owner: str) -> bool:
    done = session.exec(sa.delete(Quota).where(Quota.owner == owner)).rowcount == 1  # type: ignore[call-overload,arg-type]
    session.commit()
    return done


def usage(session: Session, owner: str | None = None) -> list[QuotaUse]:
    """Every owner with a quota or running jobs (``owner``: only that one), with what its running jobs hold."""
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    query = sa.select(Job.id, Job.owner, Job.placement, Job.borrowed).where(Job.status.in_(HOLDING))  # type: ignore[attr-defined]
    quotas = sa.select(Quota)
    if owner is not None:
        query, quotas = query.where(Job.owner == owner), quotas.where(Quota.owner == owner)
    for job_id, job_owner, placement, borrowed in session.exec(query).all():  # type: ignore[call-overload]
        nodes = placement_of(job_id, placement or [])  # the scheduler's reading of the placement JSON
        row = held[job_owner]
        row[0] += nodes.gpu_count
        row[1] += nodes.cpu_count
        row[2] += nodes.gpu_count if borrowed else 0
    rows = {q.owner: q for q in session.exec(quotas).scalars()}  # type: ignore[call-overload]
    session.commit()
    return [QuotaUse(o, rows[o].gpus if o in rows else None, rows[o].cpu_slots if o in rows else None, *held[o])
            for o in sorted(rows.keys() | held.keys())]
