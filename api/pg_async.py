"""A few psycopg async connections for the hot reads of one API process (api.job_reader).

Awaited in the event loop, a read costs no hop to a thread and back and no GIL contention with the read pool's
threads. No pre-ping: a connection the database dropped (a restart) fails its statement and is discarded; the
caller tries once more on a new one. At most ``size`` are open; a read beyond them waits for one to be returned.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import psycopg
import sqlalchemy as sa


def conninfo(database_url: str) -> str:
    """libpq's URI for SQLAlchemy's ``postgresql+psycopg://...`` URL."""
    return sa.engine.make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class AsyncPool:
    def __init__(self, database_url: str, size: int, connect_args: dict[str, Any]):
        self._conninfo, self._size, self._connect_args = conninfo(database_url), size, connect_args
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = await self._acquire()
        try:
            yield conn
        except psycopg.OperationalError:
            await self._discard(conn)  # lost or unusable: the next read opens a new one
            raise
        except BaseException:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await self._discard(conn)
            else:
                self._release(conn)
            raise
        else:
            self._release(conn)

    async def _acquire(self) -> psycopg.AsyncConnection[Any]:
        while True:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
                self._open -= 1
            if self._open < self._size:
                self._open += 1
                try:
                    return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, **self._connect_args)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._idle.append(conn)
        self._wake()

    async def _discard(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._open -= 1
        self._wake()
        with suppress(psycopg.Error):
            await conn.close()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            self._open -= 1
            await conn.close()
