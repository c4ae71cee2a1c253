"""The job state machine. Every status change goes through ``transition``.

Each change is one guarded UPDATE (``WHERE id = :id AND status = :seen``) plus a row in
the transitions table (and, into or out of ``queued``, a move of the owner's counter for the
queued-job cap, jobs.store.limits), in one transaction, so an API cancel, a worker finish and the
reconciler can race without clobbering each other: exactly one of them wins. ``requeue`` is the one way
back in line for a new attempt, and ``loss_forgiven`` the one rule for how many lost workers a job survives.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store import limits
from jobs.store.models import Attempt, Job, Status, Transition, utcnow
from jobs.webhooks import events

log = logging.getLogger(__name__)

ALLOWED: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.RUNNING: frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLING, Status.CANCELLED, Status.QUEUED}),
    Status.CANCELLING: frozenset({Status.CANCELLED, Status.FAILED, Status.SUCCEEDED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


class TransitionRefused(Exception):
    """The job is not in a state that allows the change (it moved on, or never could)."""

    def __init__(self, job_id: str, current: str | None, to: Status):
        self.job_id, self.current, self.to = job_id, current, to
        super().__init__(f"job {job_id} is {current or 'missing'}; cannot become {to.value}")


_ERROR_COLUMNS = ("error_type", "error_message", "error_traceback", "error_log_tail", "exit_code")


def transition(
    session: Session,
    job_id: str,
    to: Status,
    *,
    expect: Iterable[Status] | None = None,
    reason: str = "",
    values: dict[str, Any] | None = None,
    owner: str | None = None,
    guard: Iterable[Any] = (),
    preempted: bool = False,
) -> Job:
    """Move ``job_id`` to ``to`` if it is in one of ``expect`` (default: any state allowed to reach ``to``).

    Commits and returns the updated job; raises TransitionRefused when the guard does not hold.
    ``values`` are further columns set in the same UPDATE (SQL expressions allowed); ``guard`` further
    conditions of it (a supervisor's fence: this attempt, this worker, a live lease). ``preempted``: a move back
    to ``queued`` because the job was stopped to make room, which webhooks hear of as ``job.preempted``.
    """
    kind = events.job_event(to, preempted=preempted)
    allowed_from = {s for s, targets in ALLOWED.items() if to in targets}
    if expect is not None:
        allowed_from &= set(expect)
    where = [Job.id == job_id]
    if owner is not None:
        where.append(Job.owner == owner)
    where.extend(guard)
    for _ in range(5):
        seen = session.exec(sa.select(Job.status, Job.owner).where(*where)).first()  # type: ignore[call-overload]
        current = seen.status if seen is not None else None
        if current is None or Status(current) not in allowed_from:
            session.rollback()
            raise TransitionRefused(job_id, current, to)
        now = utcnow()
        update = sa.update(Job).where(*where, Job.status == current).values(status=to.value, updated_at=now, **(values or {}))
        if to in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED):
            update = update.values(finished_at=now, lease_expires_at=None)
        if to is Status.SUCCEEDED:
            # What failed earlier attempts stays on their records (job_attempts.error_message), not on a job that succeeded.
            update = update.values(**{k: None for k in _ERROR_COLUMNS if k not in (values or {})})
        elif to is Status.QUEUED and "placement" not in (values or {}):
            update = update.values(placement=None)  # back in line: the next attempt gets a placement of its own
        result = session.exec(update)  # type: ignore[call-overload]
        if result.rowcount == 1:
            row = session.exec(sa.select(Job.attempt, Job.name, Job.error_type, Job.error_message)  # type: ignore[call-overload]
                               .where(Job.id == job_id)).one()
            attempt = row.attempt
            session.add(Transition(job_id=job_id, at=now, from_status=current, to_status=to.value, attempt=attempt, reason=reason))
            if kind is not None:  # the webhook outbox: one insert, in this same transaction
                events.record_job(session, kind, job_id=job_id, name=row.name, owner=seen.owner, status=to.value,
                                  attempt=attempt, reason=reason,
                                  error_type=row.error_type if to.terminal else None,
                                  error_message=row.error_message if to.terminal else None)
            if (current == Status.QUEUED.value) != (to is Status.QUEUED):
                limits.move_queued(session, seen.owner, 1 if to is Status.QUEUED else -1)
            session.commit()
            log.info("job %s: %s -> %s (%s)", job_id, current, to.value, reason, extra={"job_id": job_id})
            job = session.get(Job, job_id, populate_existing=True)
            assert job is not None
            return job
        # Someone else changed the status between our read and our write: read again.
        session.rollback()
    raise TransitionRefused(job_id, None, to)


def requeue(session: Session, job_id: str, *, reason: str, spend_retry: bool, guard: Iterable[Any] = (),
            values: dict[str, Any] | None = None, preempted: bool = False) -> Job:
    """Move a running job back to ``queued`` for its next attempt; raises TransitionRefused like ``transition``.

    The attempt number goes up, which fences out the attempt that ends (every write of its supervisor names it), and the
    job lets its worker and lease go. ``spend_retry`` False gives the retry back (``max_attempts`` grows with the
    attempt): what ended it was not the job's fault. ``values``: further columns (the error, a hold, a new spec)."""
    moved: dict[str, Any] = {"attempt": Job.attempt + 1, "worker_id": None, "lease_expires_at": None, **(values or {})}
    if not spend_retry:
        moved["max_attempts"] = Job.max_attempts + 1
    return transition(session, job_id, Status.QUEUED, expect=[Status.RUNNING], reason=reason, values=moved,
                      guard=guard, preempted=preempted)


def loss_forgiven(earlier_losses: int, max_worker_losses: int) -> bool:
    """Whether a lost worker (or node) puts the job back in line without spending a retry: the first
    ``max_worker_losses`` losses of a job are; the one after them fails it (a job that keeps taking its host down).
    ``earlier_losses``: the job's attempts lost before the one being judged (``worker_losses``)."""
    return earlier_losses < max_worker_losses


def worker_losses(session: Session, job_id: str, before_attempt: int) -> int:
    """The job's attempts before ``before_attempt`` that ended with a lost worker (or, for a multi-node job, a lost node)."""
    if before_attempt <= 1:
        return 0
    query = sa.select(sa.func.count()).select_from(Attempt).where(
        Attempt.job_id == job_id, Attempt.attempt < before_attempt, Attempt.outcome == "lost")
    return session.exec(query).scalar_one()  # type: ignore[call-overload, no-any-return]


_CANCEL_REQUESTED = "cancel requested by "


def canceller(actor: str, owner: str) -> str:
    """Who a cancel's reasons name: ``user`` for the owner's own, else the ``actor`` (the admin)."""
    return "user" if actor == owner else actor


def cancel_requested(by: str) -> str:
    """The reason of a running job's move to ``cancelling``: who asked (``canceller``)."""
    return _CANCEL_REQUESTED + by


def cancelled(by: str) -> str:
    """The reason of a job's (or a sweep's) move to ``cancelled``."""
    return f"cancelled by {by}"


def cancelled_by(session: Session, job_id: str) -> str:
    """Who asked for the job's cancel, as its last move to ``cancelling`` says; ``user`` where it does not say."""
    reason = session.exec(sa.select(Transition.reason).where(  # type: ignore[call-overload]
        Transition.job_id == job_id, Transition.to_status == Status.CANCELLING.value).order_by(Transition.id.desc()).limit(1)).first()  # type: ignore[union-attr]
    session.commit()
    return reason[0].removeprefix(_CANCEL_REQUESTED) if reason and reason[0].startswith(_CANCEL_REQUESTED) else "user"
