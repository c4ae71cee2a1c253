"""How ``GET /v1/jobs/{id}`` reads a job: one statement (jobs.reads.job_read), in the event loop.

On SQLite the statement takes tens of microseconds, less than a hop to a thread and back, so the event loop runs
it itself on a connection of its own that no other thread uses, so it never waits for one; in WAL mode a read does
not wait for writers either. On PostgreSQL it is awaited on a psycopg async connection (api.pg_async), without
``pool_pre_ping``'s extra round trip. A queued job's detail also asks Redis where it stands, which the route
does on the read pool (api.read_pool). Errors come out as SQLAlchemy's, as from every other route (503 when the
database does not answer).
"""

from __future__ import annotations

import logging
import sqlite3

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from api import read_pool
from api.pg_async import AsyncPool
from jobs.reads import job_read
from jobs.store.db import postgres_connect_args, sqlite_connect

log = logging.getLogger(__name__)


class JobReader:
    def __init__(self, database_url: str, shared: Engine, pool_size: int):
        self.url, self.engine = database_url, shared
        self._sqlite: sqlite3.Connection | None = None
        self._pg: AsyncPool | None = None
        # An in-memory SQLite database exists only on its own connections: it is read through the shared engine.
        self._file = shared.dialect.name == "sqlite" and sa.engine.make_url(database_url).database not in (None, "", ":memory:")
        if shared.dialect.name == "postgresql" and shared.dialect.driver == "psycopg":
            self._pg = AsyncPool(database_url, pool_size, postgres_connect_args())

    async def read(self, job_id: str) -> job_read.JobRows | None:
        if self._file:
            try:
                if self._sqlite is None:
                    # Opened at the first read, not at start: the schema is migrated by then (jobs.store.db.migrate).
                    self._sqlite = sqlite_connect(self.url)
                return job_read.read_sqlite(self._sqlite, job_id)
            except sqlite3.OperationalError as exc:
                raise sa.exc.OperationalError("job detail", {"job_id": job_id}, exc) from exc
        if self._pg is not None:
            try:
                return await self._read_pg(job_id)
            except psycopg.OperationalError:
                # The database restarted since this connection was opened (there is no pre-ping): it is discarded,
                # and the second try connects anew. A second failure is the database not answering.
                log.info("job read: the database connection was lost; reading again on a new one")
                try:
                    return await self._read_pg(job_id)
                except psycopg.OperationalError as exc:
                    raise sa.exc.OperationalError("job detail", {"job_id": job_id}, exc) from exc
        return await read_pool.run(self._read_shared, job_id)

    async def _read_pg(self, job_id: str) -> job_read.JobRows | None:
        assert self._pg is not None
        async with self._pg.connection() as conn:
            return await job_read.read_psycopg_async(conn, job_id)

    def _read_shared(self, job_id: str) -> job_read.JobRows | None:
        with self.engine.connect() as conn:
            return job_read.read(conn, job_id)

    async def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            await self._pg.close()
