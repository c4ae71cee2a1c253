"""How ``GET /v1/jobs/{id}`` reads a job: one statement (jobs.job_read).

On SQLite the statement takes tens of microseconds, less than a hop to a thread and back, so the event loop runs
it itself (``inline``) on a connection of its own that no other thread uses, so it never waits for one; in WAL mode
a read does not wait for writers either. On PostgreSQL it is a network round trip and runs on the read pool
(api.read_pool), on an engine without ``pool_pre_ping`` (jobs.db.make_read_engine). A queued job's detail also
asks Redis where it stands, which always runs on the read pool.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from jobs import job_read
from jobs.db import make_read_engine, sqlite_connect

log = logging.getLogger(__name__)


class JobReader:
    def __init__(self, database_url: str, shared: Engine, pool_size: int):
        self.url, self.engine, self._sqlite = database_url, shared, None
        # An in-memory SQLite database exists only on its own connections: it is read through the shared engine.
        self.inline = shared.dialect.name == "sqlite" and sa.engine.make_url(database_url).database not in (None, "", ":memory:")
        if shared.dialect.name != "sqlite":
            self.engine = make_read_engine(database_url, pool_size)

    def read(self, job_id: str) -> job_read.JobRows | None:
        """``inline``: call it from the event loop only (its one connection is not shared between threads)."""
        if self.inline:
            if self._sqlite is None:
                # Opened at the first read, not at start: the schema is migrated by then (jobs.db.migrate).
                self._sqlite = sqlite_connect(self.url)
            return job_read.read_sqlite(self._sqlite, job_id)
        try:
            return self._read(job_id)
        except sa.exc.DBAPIError as exc:
            # The database restarted since this pooled connection was opened: the failure invalidated the pool
            # (there is no pre-ping), so the second try connects anew. Any other error is the caller's.
            if not exc.connection_invalidated:
                raise
            log.info("job read: the database connection was lost (%s); reading again on a new one", exc.__class__.__name__)
            return self._read(job_id)

    def _read(self, job_id: str) -> job_read.JobRows | None:
        with self.engine.connect() as conn:
            return job_read.read(conn, job_id)

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self.engine.dialect.name != "sqlite":
            self.engine.dispose()
