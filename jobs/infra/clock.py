"""The database's clock, for leases: stamped and compared by the database itself, so hosts whose
clocks disagree (a worker 60 s off) agree on when a lease lapses."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import Session


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def db_now(session: Session, plus_s: float = 0.0) -> Any:
    """An SQL expression: the database's current UTC time (naive, as timestamps are stored) plus ``plus_s`` seconds."""
    if _dialect(session) == "postgresql":
        # statement_timestamp, not now(): a long transaction must not see the time stand still.
        now = sa.func.timezone("UTC", sa.func.statement_timestamp())
        return now + sa.func.make_interval(0, 0, 0, 0, 0, 0, float(plus_s)) if plus_s else now
    # SQLite stores timestamps as 'YYYY-MM-DD HH:MM:SS.ffffff' text; %f gives milliseconds, padded to micro.
    modifier = f"{float(plus_s):+.3f} seconds"
    return sa.func.strftime("%Y-%m-%d %H:%M:%f", "now", modifier, type_=sa.String).concat("000")
