"""Per-owner caps on queued and running jobs.

The queued cap is enforced at submission (HTTP 429). The running cap is a dispatch rule:
the scheduler places no more of an owner's jobs than it allows (jobs/scheduling/scheduler.py), and a
job held by it stays queued with ``waiting_reason`` saying so.

The queued cap reads no COUNT: each owner has a counter row (``owner_counters``) that every insert of a
queued job and every status change into or out of ``queued`` moves in its own transaction. A submission
takes a slot with one conditional UPDATE (``queued < cap``); the row's lock, held from that UPDATE to the
commit, is all that concurrent submissions of one owner wait on, and it is taken last so the wait is short.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session

from jobs.store.models import Job, OwnerCounter

_COUNTERS = OwnerCounter.__table__  # type: ignore[attr-defined]

# Built once with bound parameters: submissions run them on every request.
_TAKE_SLOT = (sa.update(_COUNTERS).where(_COUNTERS.c.owner == sa.bindparam("o"), _COUNTERS.c.queued < sa.bindparam("cap"))
              .values(queued=_COUNTERS.c.queued + 1))
_MOVE = sa.update(_COUNTERS).where(_COUNTERS.c.owner == sa.bindparam("o")).values(queued=_COUNTERS.c.queued + sa.bindparam("delta"))
_READ = sa.select(_COUNTERS.c.queued).where(_COUNTERS.c.owner == sa.bindparam("o"))


class OverLimit(Exception):
    """A per-owner cap refuses the request (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int = 30):
        self.retry_after_s = retry_after_s
        super().__init__(message)


def count(session: Session, owner: str, statuses: tuple[str, ...]) -> int:
    query = sa.select(sa.func.count()).select_from(Job).where(Job.owner == owner, Job.status.in_(statuses))  # type: ignore[attr-defined]
    return int(session.exec(query).scalar_one())  # type: ignore[call-overload]


def _over_queued_cap(owner: str, queued: int, cap: int) -> OverLimit:
    return OverLimit(
        f"owner {owner!r} already has {queued} queued jobs, the cap is {cap} "
        "(TORCHYARD_MAX_QUEUED_PER_OWNER); wait for some to start or cancel some, then submit again"
    )


def _ensure_row(conn: sa.Connection, owner: str) -> None:
    """The owner's counter row, made at zero if missing; a concurrent maker of it wins and this does nothing."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(_COUNTERS).values(owner=owner, queued=0).on_conflict_do_nothing(index_elements=["owner"]))


def queued_jobs(session: Session, owner: str) -> int:
    """The owner's counter: its queued jobs as the cap sees them."""
    return int(session.connection().execute(_READ, {"o": owner}).scalar() or 0)


def take_queued_slot(session: Session, owner: str, cap: int) -> None:
    """Count one more queued job of ``owner`` in the session's transaction, or raise OverLimit at ``cap``.

    Run it as the transaction's last statement before the commit: on PostgreSQL the counter row stays locked
    from here to the commit (a concurrent submission of the owner waits, then re-checks ``queued < cap`` on the
    committed value); on SQLite the transaction already holds the database's write lock."""
    conn = session.connection()
    if conn.execute(_TAKE_SLOT, {"o": owner, "cap": cap}).rowcount == 1:
        return
    current = conn.execute(_READ, {"o": owner}).scalar()
    if current is None:  # the owner's first submission
        _ensure_row(conn, owner)
        if conn.execute(_TAKE_SLOT, {"o": owner, "cap": cap}).rowcount == 1:
            return
        current = conn.execute(_READ, {"o": owner}).scalar()
    raise _over_queued_cap(owner, int(current or 0), cap)


def move_queued(session: Session, owner: str, delta: int) -> None:
    """Add ``delta`` to the owner's counter in the session's transaction: a job entered (+1) or left (-1) ``queued``."""
    conn = session.connection()
    # No row: the owner's jobs predate counting; one entering the queue starts its row, one leaving it has nothing to undo.
    if conn.execute(_MOVE, {"o": owner, "delta": delta}).rowcount == 0 and delta > 0:
        _ensure_row(conn, owner)
        conn.execute(_MOVE, {"o": owner, "delta": delta})
