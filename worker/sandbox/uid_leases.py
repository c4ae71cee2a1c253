"""Leasing a job uid in SQL, unique across every worker sharing the runs volume (containers on one host, or
hosts on shared storage: a host-local lock would not do). A row per uid in use; acquiring is an INSERT that
loses to a concurrent one on the primary key and tries again. A row whose job no longer runs that attempt
(its worker vanished) is stale: it is taken over in the same transaction as the INSERT."""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from jobs.store.models import Job, JobUid, Status, utcnow
from worker.sandbox.job_users import pick_uid

log = logging.getLogger(__name__)

_LIVE = (Status.RUNNING.value, Status.CANCELLING.value)


class NoFreeUid(RuntimeError):
    pass


def _live_condition() -> sa.ColumnElement[bool]:
    return sa.exists().where(Job.id == JobUid.job_id, Job.attempt == JobUid.attempt,
                             Job.status.in_(_LIVE))  # type: ignore[attr-defined]


def held(session: Session, job_id: str, attempt: int) -> int | None:
    """The uid this attempt of the job holds (another node of a multi-node job runs as the same uid)."""
    uid = session.exec(sa.select(JobUid.uid).where(JobUid.job_id == job_id, JobUid.attempt == attempt)).scalar()  # type: ignore[call-overload]
    session.commit()
    return uid


def acquire(session: Session, uids: tuple[int, int], job_id: str, attempt: int, worker_id: str, tries: int = 20) -> int:
    """A uid of the range for this attempt, leased until ``release``. Raises NoFreeUid when every uid runs a job."""
    existing = held(session, job_id, attempt)
    if existing is not None:
        return existing
    low, high = uids
    for _ in range(tries):
        rows = session.exec(sa.select(JobUid.uid, _live_condition().label("live"))  # type: ignore[call-overload]
                            .where(JobUid.uid.between(low, high))).all()  # type: ignore[attr-defined]
        live = {uid for uid, is_live in rows if is_live}
        # A stale uid last: the supervisor that held it may still wake up and kill what runs as it.
        uid = pick_uid(uids, {uid for uid, _ in rows}, job_id)
        if uid is None:
            uid = pick_uid(uids, live, job_id)
        if uid is None:
            session.rollback()
            raise NoFreeUid(f"every uid of TORCHYARD_JOB_UIDS={low}-{high} runs a job")
        try:
            # Stale: its job no longer runs that attempt. Deleted and re-taken in one transaction.
            session.exec(sa.delete(JobUid).where(JobUid.uid == uid, ~_live_condition()))  # type: ignore[call-overload]
            session.add(JobUid(uid=uid, job_id=job_id, attempt=attempt, worker_id=worker_id, acquired_at=utcnow()))
            session.commit()
            return uid
        except IntegrityError:
            session.rollback()  # another worker took it first
    raise NoFreeUid(f"no uid of {low}-{high} could be leased in {tries} tries")


def release(session: Session, uid: int, job_id: str, attempt: int) -> None:
    session.exec(sa.delete(JobUid).where(JobUid.uid == uid, JobUid.job_id == job_id, JobUid.attempt == attempt))  # type: ignore[call-overload]
    session.commit()


def foreign_uids(session: Session, uids: tuple[int, int], worker_id: str) -> set[int]:
    """Uids of the range that live attempts of other workers hold: a starting worker kills the rest on its host."""
    rows = session.exec(sa.select(JobUid.uid).where(  # type: ignore[call-overload]
        JobUid.uid.between(*uids), JobUid.worker_id != worker_id, _live_condition())).scalars()  # type: ignore[attr-defined]
    found = set(rows)
    session.commit()
    return found
