"""A named lease in SQL, held by one process at a time: the scheduler's leader.

Stamped and compared with the database's clock. Every process that may lead calls ``hold`` each period:
the holder renews it, anyone else takes it only once it lapsed. A leader's writes carry ``still_held`` in
their own transaction, so a leader that froze past its lease and woke up writes nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from jobs.infra.clock import db_now
from jobs.store.models import Lease

SCHEDULER = "scheduler"
SWEEPS = "sweeps"  # the sweep controller (jobs.sweeps.controller)
WEBHOOKS = "webhooks"  # the webhook sender (jobs.webhooks.sender)
ALL = (SCHEDULER, SWEEPS, WEBHOOKS)


def hold(session: Session, name: str, holder: str, ttl_s: float) -> bool:
    """Take or renew the lease ``name`` for ``holder`` for ``ttl_s`` seconds; False while another holds it. Commits."""
    result = session.exec(  # type: ignore[call-overload]
        sa.update(Lease)
        .where(Lease.name == name, sa.or_(Lease.holder == holder, Lease.expires_at.is_(None),  # type: ignore[union-attr]
                                          Lease.expires_at < db_now(session)))
        .values(holder=holder, expires_at=db_now(session, ttl_s)))
    if result.rowcount == 1:
        session.commit()
        return True
    session.rollback()
    try:
        session.exec(sa.insert(Lease).values(name=name, holder=holder, expires_at=db_now(session, ttl_s)))  # type: ignore[call-overload]
        session.commit()
    except IntegrityError:
        session.rollback()  # the row exists and another holds it
        return False
    return True


def still_held(session: Session, name: str, holder: str, ttl_s: float) -> bool:
    """Renew the lease inside the caller's open transaction, without committing: True when ``holder`` still has it.
    The row lock this takes (PostgreSQL) or the write lock (SQLite) keeps a takeover out until that transaction ends."""
    result = session.exec(  # type: ignore[call-overload]
        sa.update(Lease).where(Lease.name == name, Lease.holder == holder, Lease.expires_at >= db_now(session))
        .values(expires_at=db_now(session, ttl_s)))
    return result.rowcount == 1


def release(session: Session, name: str, holder: str) -> None:
    """Give the lease up (a clean stop): a standby takes it at its next period instead of one lease later."""
    session.exec(sa.update(Lease).where(Lease.name == name, Lease.holder == holder).values(expires_at=None))  # type: ignore[call-overload]
    session.commit()


def held(session: Session) -> set[str]:
    """The leases some process holds now (a started service holds every one of ``ALL``)."""
    rows = session.exec(sa.select(Lease.name).where(Lease.expires_at >= db_now(session)))  # type: ignore[call-overload, operator]
    return {name for (name,) in rows}
