"""Host and GPU states: a drain keeps new work off a host, a quarantine keeps one GPU out of placement.

A host is ``draining`` from its drain until nothing runs there, then ``drained`` (derived from the running
placements, never stored, so the two cannot disagree), and ``ready`` again once undrained. A GPU is
``ready`` or ``quarantined`` (with its reason) until an admin clears it. Every drain, undrain, quarantine and
clear is a row of ``host_events``: the host's history, and what the admin's notifications are sent from.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.hosts.registry import holdings, quarantined  # noqa: F401 - quarantined: read with the states it keeps
from jobs.scheduling import stops
from jobs.store.models import Host, HostEvent, HostGpu, utcnow
from jobs.webhooks import events

log = logging.getLogger(__name__)

HEALTH_CHECK = "health-check"
DEVICE_FAULT = "device-fault"


def drain_stop_reason(host_id: str, reason: str) -> str:
    """What a job stopped by a drain says until it runs again (its waiting reason begins with it)."""
    return f"preempted: host {host_id} is draining: {reason}"


def record(session: Session, host_id: str, kind: str, actor: str, reason: str | None = None, gpu: int | None = None) -> None:
    session.add(HostEvent(host_id=host_id, at=utcnow(), kind=kind, gpu=gpu, reason=reason[:1000] if reason else reason,
                          actor=actor[:64]))
    events.record_host(session, kind, host_id=host_id, actor=actor, reason=reason, gpu=gpu)  # committed with the change


def drain(session: Session, host_id: str, reason: str, actor: str) -> list[str] | None:
    """Drain ``host_id`` and ask each job running there to checkpoint and go back in line. None: no such host.
    Draining a draining host again replaces its reason. Returns the jobs asked to stop."""
    if session.get(Host, host_id) is None:
        session.rollback()
        return None
    session.exec(sa.update(Host).where(Host.id == host_id).values(drain_reason=reason[:1000], drained_by=actor[:64]))  # type: ignore[call-overload]
    record(session, host_id, "drain", actor, reason)
    session.commit()
    log.info("host %s drained by %s: %s", host_id, actor, reason)
    return stop_jobs_on(session, host_id, reason)


def stop_jobs_on(session: Session, host_id: str, reason: str) -> list[str]:
    """Ask every job running on ``host_id`` to make room (a guarded UPDATE each: one asked already is left as is)."""
    running = {h.job_id for h in holdings(session).get(host_id, [])}
    return [job_id for job_id in sorted(running) if stops.request_stop(session, job_id, reason=drain_stop_reason(host_id, reason))]


def undrain(session: Session, host_id: str, actor: str, *, only_by: str | None = None) -> bool | None:
    """Return ``host_id`` to placement. ``only_by``: only a drain that actor made (the health check undoes its own).
    None: no such host; False: it was not drained (by ``only_by``)."""
    if session.get(Host, host_id) is None:
        session.rollback()
        return None
    where = [Host.id == host_id, Host.drain_reason.is_not(None)]  # type: ignore[union-attr]
    if only_by is not None:
        where.append(Host.drained_by == only_by)
    done = session.exec(sa.update(Host).where(*where).values(drain_reason=None, drained_by=None)).rowcount == 1  # type: ignore[call-overload]
    if done:
        record(session, host_id, "undrain", actor)
        log.info("host %s undrained by %s", host_id, actor)
    session.commit()
    return done


def clear_gpu(session: Session, host_id: str, gpu: int, actor: str) -> bool | None:
    """Return a quarantined GPU to placement, its fault count reset. None: no such host or GPU; False: it was ready."""
    host = session.get(Host, host_id)
    if host is None or gpu not in host.gpus:
        session.rollback()
        return None
    done = session.exec(sa.update(HostGpu).where(  # type: ignore[call-overload]
        HostGpu.host_id == host_id, HostGpu.gpu == gpu, HostGpu.quarantine_reason.is_not(None))  # type: ignore[union-attr]
        .values(quarantine_reason=None, faults=0)).rowcount == 1
    if done:
        record(session, host_id, "clear", actor, gpu=gpu)
        log.info("host %s GPU %d cleared by %s", host_id, gpu, actor)
    session.commit()
    return done


def history(session: Session, host_id: str, limit: int = 200) -> list[dict[str, Any]]:
    """The host's drains, undrains, quarantines and clears, oldest first (the latest ``limit``)."""
    rows = session.exec(sa.select(HostEvent).where(HostEvent.host_id == host_id)  # type: ignore[call-overload]
                        .order_by(HostEvent.id.desc()).limit(limit)).scalars().all()  # type: ignore[union-attr]
    session.commit()
    return [{"at": e.at, "kind": e.kind, "gpu": e.gpu, "reason": e.reason, "by": e.actor} for e in reversed(rows)]
