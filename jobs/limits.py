"""Per-owner caps on queued and running jobs.

The queued cap is enforced at submission (HTTP 429). The running cap is a dispatch rule:
a job over it stays queued, and ``waiting_reason`` says so. The worker enforces it when it
claims a job (``running_cap_reached``).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlmodel import Session

from jobs.models import Job, Status
from jobs.settings import Settings

_RUNNING = (Status.RUNNING.value, Status.CANCELLING.value)
_sqlite_lock = threading.Lock()


class OverLimit(Exception):
    """A per-owner cap refuses the request (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int = 30):
        self.retry_after_s = retry_after_s
        super().__init__(message)


def count(session: Session, owner: str, statuses: tuple[str, ...]) -> int:
    query = sa.select(sa.func.count()).select_from(Job).where(Job.owner == owner, Job.status.in_(statuses))  # type: ignore[attr-defined]
    return int(session.exec(query).scalar_one())  # type: ignore[call-overload]


def running_cap_reached(session: Session, owner: str, settings: Settings) -> bool:
    return count(session, owner, _RUNNING) >= settings.max_running_per_owner


def check_submit(session: Session, owner: str, settings: Settings) -> None:
    queued = count(session, owner, (Status.QUEUED.value,))
    if queued >= settings.max_queued_per_owner:
        raise OverLimit(
            f"owner {owner!r} already has {queued} queued jobs, the cap is {settings.max_queued_per_owner} "
            "(TORCHYARD_MAX_QUEUED_PER_OWNER); wait for some to start or cancel some, then submit again"
        )


@contextmanager
def owner_lock(session: Session, owner: str) -> Iterator[None]:
    """Hold while checking a cap and inserting, so two concurrent submissions cannot both pass the check.

    PostgreSQL: a transaction-scoped advisory lock per owner (released at commit or rollback).
    SQLite: a process-wide lock; SQLite deployments run one API process."""
    if session.get_bind().dialect.name == "postgresql":
        session.exec(sa.select(sa.func.pg_advisory_xact_lock(zlib.crc32(f"owner:{owner}".encode()))))  # type: ignore[call-overload]
        yield
        return
    with _sqlite_lock:
        yield
