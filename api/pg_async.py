"""A few psycopg async connections for the hot reads of one API process (api.job_reader).

Awaited in the event loop, a read costs no hop to a thread and back and no GIL contention with the read pool's
threads. psycopg_pool's AsyncConnectionPool without a ``check``: no pre-ping; a connection the database dropped
(a restart) fails its statement, is discarded on return, and the caller tries once more on a new one. At most
``size`` are open; a read beyond them waits for one to be returned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg_pool import AsyncConnectionPool


def conninfo(database_url: str) -> str:
    """libpq's URI for SQLAlchemy's ``postgresql+psycopg://...`` URL."""
    return sa.engine.make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class AsyncPool:
    def __init__(self, database_url: str, size: int, connect_args: dict[str, Any]):
        # Opened at the first read, in the event loop that serves it; none opened ahead of a read (min_size 0).
        # A read waits for a connection no longer than one connect may take, so a database that is down answers 503
        # about as soon as a connect to it fails.
        self._pool = AsyncConnectionPool(
            conninfo(database_url), kwargs={"autocommit": True, **connect_args}, min_size=0, max_size=size, open=False,
            timeout=float(connect_args.get("connect_timeout") or 10), name="job-detail")
        self._opened = False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if not self._opened:
            await self._pool.open(wait=False)
            self._opened = True
        async with self._pool.connection() as conn:
            yield conn

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()
