"""Hosts: what each worker owns (GPU indices, CPU slots), registered and heart-beaten in SQL, and who holds it now.

A host is alive while its last heartbeat, stamped with the database's clock, is younger than one lease
(``TORCHYARD_LEASE_TTL_S``). What a host's devices are held by is read from the placements of the jobs that
run now, so a host's row never needs to know about jobs, and a dead worker's row cannot keep a GPU held.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.infra.clock import db_now
from jobs.store.models import Host, HostGpu, Job, Status

log = logging.getLogger(__name__)

HOLDING = (Status.RUNNING.value, Status.CANCELLING.value)
READY, DRAINING, DRAINED, QUARANTINED = "ready", "draining", "drained", "quarantined"


def host_state(drain_reason: str | None, holding: bool) -> str:
    """``drained`` is a draining host that nothing runs on any more: derived, so it cannot go stale."""
    if drain_reason is None:
        return READY
    return DRAINING if holding else DRAINED


@dataclass(frozen=True)
class Inventory:
    """What a worker declares about its host at start."""

    id: str
    gpus: tuple[int, ...]
    cpu_slots: int
    queues: tuple[str, ...]
    executor: str = "local"
    address: str | None = None


def register(session: Session, inv: Inventory) -> None:
    """Insert or replace the host's row and stamp it seen now. A restarted worker of the same id takes the row over."""
    values: dict[str, Any] = {
        "gpus": list(inv.gpus), "cpu_slots": inv.cpu_slots, "queues": list(inv.queues), "executor": inv.executor,
        "address": inv.address, "registered_at": db_now(session), "last_seen": db_now(session),
    }
    updated = session.exec(sa.update(Host).where(Host.id == inv.id).values(**values)).rowcount  # type: ignore[call-overload]
    if not updated:
        session.exec(sa.insert(Host).values(id=inv.id, **values))  # type: ignore[call-overload]
    session.commit()


def heartbeat(session: Session, host_id: str) -> bool:
    """Stamp the host seen now; False when its row is gone (then the worker registers again)."""
    result = session.exec(  # type: ignore[call-overload]
        sa.update(Host).where(Host.id == host_id).values(last_seen=db_now(session)))
    session.commit()
    return result.rowcount == 1


def deregister(session: Session, host_id: str) -> None:
    """A worker that stops cleanly says so: its host is dead at once, not one lease later."""
    session.exec(sa.update(Host).where(Host.id == host_id).values(last_seen=None))  # type: ignore[call-overload]
    session.commit()


@dataclass(frozen=True)
class HostRow:
    host: Host
    alive: bool


def read_hosts(session: Session, lease_ttl_s: float) -> list[HostRow]:
    """Every registered host with whether it heartbeat within one lease, by id."""
    alive = sa.and_(Host.last_seen.is_not(None), Host.last_seen >= db_now(session, -lease_ttl_s))  # type: ignore[union-attr]
    rows = session.exec(sa.select(Host, alive.label("alive")).order_by(Host.id)).all()  # type: ignore[call-overload]
    session.commit()
    return [HostRow(host, bool(is_alive)) for host, is_alive in rows]


@dataclass(frozen=True)
class Holding:
    """A running job's node on one host."""

    job_id: str
    owner: str
    gpus: tuple[int, ...]
    cpu_slots: int


def holdings(session: Session) -> dict[str, list[Holding]]:
    """Per host id, the nodes of the jobs that hold devices now (running or cancelling, with a placement)."""
    rows = session.exec(sa.select(Job.id, Job.owner, Job.placement).where(  # type: ignore[call-overload]
        Job.status.in_(HOLDING), Job.placement.is_not(None))).all()  # type: ignore[attr-defined, union-attr]
    session.commit()
    held: dict[str, list[Holding]] = {}
    for job_id, owner, placement in rows:
        for node in placement or []:
            held.setdefault(node["host"], []).append(
                Holding(job_id, owner, tuple(node.get("gpus") or ()), int(node.get("cpu_slots") or 0)))
    return held


def quarantined(session: Session) -> dict[str, dict[int, str]]:
    """Per host id, its quarantined GPUs (jobs/hosts/states.py) with their reasons."""
    rows = session.exec(sa.select(HostGpu.host_id, HostGpu.gpu, HostGpu.quarantine_reason)  # type: ignore[call-overload]
                        .where(HostGpu.quarantine_reason.is_not(None))).all()  # type: ignore[union-attr]
    session.commit()
    out: dict[str, dict[int, str]] = {}
    for host_id, gpu, reason in rows:
        out.setdefault(host_id, {})[gpu] = reason
    return out


def host_view(row: HostRow, held: list[Holding], viewer: str | None, bad: dict[int, str] | None = None) -> dict[str, Any]:
    """One host as ``GET /v1/hosts`` shows it to ``viewer`` (an owner; None: the admin, who sees every job id).
    Another owner's GPU shows as busy without its job id: tenants learn how full a host is, not whose work runs."""
    by_gpu = {gpu: h for h in held for gpu in h.gpus}
    gpus = []
    for index in row.host.gpus:
        holder = by_gpu.get(index)
        visible = holder is not None and (viewer is None or holder.owner == viewer)
        why = (bad or {}).get(index)
        gpus.append({"index": index, "busy": holder is not None, "job_id": holder.job_id if visible else None,
                     "state": QUARANTINED if why is not None else READY, "reason": why})
    cpu_used = sum(h.cpu_slots for h in held)
    last_seen: datetime | None = row.host.last_seen
    return {
        "id": row.host.id, "alive": row.alive, "last_seen": last_seen, "gpus": gpus,
        "state": host_state(row.host.drain_reason, bool(held)), "reason": row.host.drain_reason,
        "cpu_slots": {"total": row.host.cpu_slots, "used": cpu_used},
        "queues": list(row.host.queues), "executor": row.host.executor,
        "jobs": sorted({h.job_id for h in held if viewer is None or h.owner == viewer}),
    }


def list_hosts(session: Session, lease_ttl_s: float, viewer: str | None) -> list[dict[str, Any]]:
    held, bad = holdings(session), quarantined(session)
    return [host_view(row, held.get(row.host.id, []), viewer, bad.get(row.host.id)) for row in read_hosts(session, lease_ttl_s)]
