"""Making room: a stop the service asks of a running job, and a hold that keeps a queued job out of placement.

A stop request is what preemption (and a sweep pausing a trial at a rung) asks: the supervisor of the
job's attempt sees it on its next poll, sends the ranks SIGTERM with the stop grace to checkpoint, and
puts the job back in ``queued`` without spending a retry, the request's words becoming its waiting
reason. A hold keeps a queued job where it is until released; the scheduler shows the hold's words as
the waiting reason. Both are one guarded UPDATE, so they race safely with a finish or a cancel.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import Job, Status


def request_stop(session: Session, job_id: str, *, reason: str, hold: str | None = None,
                 attempt: int | None = None) -> bool:
    """Ask the running job ``job_id`` (at ``attempt``, if given) to checkpoint and go back in line.

    ``hold``: it then stays queued until ``release``. False: it is not running (anymore), or was asked already.
    """
    where = [Job.id == job_id, Job.status == Status.RUNNING.value, Job.stop_request.is_(None)]  # type: ignore[union-attr]
    if attempt is not None:
        where.append(Job.attempt == attempt)
    values: dict[str, object] = {"stop_request": reason[:1000]}
    if hold is not None:
        values["hold"] = hold[:1000]
    done = session.exec(sa.update(Job).where(*where).values(**values)).rowcount == 1  # type: ignore[call-overload]
    session.commit()
    return done


def hold(session: Session, job_id: str, reason: str) -> bool:
    """Keep the queued or running job ``job_id`` out of placement (from its next time in line) until ``release``."""
    done = session.exec(sa.update(Job).where(  # type: ignore[call-overload]
        Job.id == job_id, Job.status.in_([Status.QUEUED.value, Status.RUNNING.value]))  # type: ignore[attr-defined]
        .values(hold=reason[:1000])).rowcount == 1
    session.commit()
    return done


def release(session: Session, job_id: str) -> bool:
    """Let a held job be placed again. False: it holds nothing."""
    done = session.exec(sa.update(Job).where(Job.id == job_id, Job.hold.is_not(None))  # type: ignore[call-overload,union-attr]
                        .values(hold=None)).rowcount == 1
    session.commit()
    return done
