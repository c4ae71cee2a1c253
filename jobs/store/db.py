"""Engine, sessions and schema migrations. SQLite by default (WAL, busy timeout), PostgreSQL from the URL.

``python -m jobs.store.db upgrade`` applies the migrations by hand (the API and the worker do it at start)."""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from jobs.infra import fork_guard
from jobs.settings import get_settings
from jobs.store import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from jobs.webhooks import models as webhook_models  # noqa: F401  (and the webhook tables)

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # WAL lets the API read while a worker writes; the busy timeout turns lock contention into waiting, not errors.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            _create_private(path)
        engine = sa.create_engine(url, creator=lambda: _open_sqlite(url))
        fork_guard.count_connections(engine)  # the worker forks its tasks: jobs/infra/fork_guard.py
        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=_postgres_timeouts())


def _create_private(path: str) -> None:
    """Create ``path`` 0600 if it does not exist: SQLite gives its -wal, -shm and journal the main file's mode, and
    the database holds every API key's hash and every job's record, nothing a job's uid may read or write."""
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def postgres_connect_args() -> dict[str, Any]:
    """The connect and statement timeouts and keepalives of every PostgreSQL connection, as libpq parameters."""
    return _postgres_timeouts()


def sqlite_connect(url: str) -> sqlite3.Connection:
    """A plain sqlite3 connection to the file of ``url``, with the pragmas every torchyard connection has."""
    conn = sqlite3.connect(sa.engine.make_url(url).database or ":memory:", timeout=30, check_same_thread=False)
    _sqlite_pragmas(conn, None)
    return conn


def _open_sqlite(url: str) -> sqlite3.Connection:
    # Opening the file and running the pragmas take SQLite's locks: counted as in use, so no task forks meanwhile.
    with fork_guard.GUARD.in_use():
        return sqlite_connect(url)


def _postgres_timeouts() -> dict[str, Any]:
    """Connect and statement timeouts and TCP keepalives: a database gone silent (a partition, a host that froze)
    raises within seconds instead of blocking a supervisor whose ranks train on without a lease."""
    s = get_settings()
    args: dict[str, Any] = {
        "connect_timeout": s.db_connect_timeout_s, "keepalives": 1, "keepalives_idle": s.db_keepalive_idle_s,
        "keepalives_interval": s.db_keepalive_interval_s, "keepalives_count": s.db_keepalive_count,
        # Unacknowledged writes: what keepalives do not cover (Linux TCP_USER_TIMEOUT, milliseconds).
        "tcp_user_timeout": 1000 * (s.db_keepalive_idle_s + s.db_keepalive_interval_s * s.db_keepalive_count),
    }
    options = {"statement_timeout": s.db_statement_timeout_s,
               "idle_in_transaction_session_timeout": s.db_idle_in_transaction_timeout_s}
    if any(options.values()):
        args["options"] = " ".join(f"-c {name}={int(value * 1000)}" for name, value in options.items() if value)
    return args


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    return make_engine(url)


MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any fixed 64-bit number; every torchyard process that migrates takes the same PostgreSQL advisory lock.
_PG_MIGRATION_LOCK = 0x746F7263687964
_BASELINE = "0001"


def _alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


@contextmanager
def _migration_lock(engine: Engine, conn: sa.Connection) -> Iterator[None]:
    """Serialise concurrent starts (API replicas, workers): the second waits, then finds the schema at head."""
    if engine.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        conn.commit()
        try:
            yield
        finally:
            conn.rollback()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_MIGRATION_LOCK})
            conn.commit()
        return
    yield


@contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    """SQLite has no advisory locks; an flock on a file next to the database does the same on one host. Taken
    before connecting: a new connection switches the file to WAL, which fails at once while another migrates."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:":
        yield
        return
    with os.fdopen(os.open(f"{path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600), "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def newest_migration() -> str:
    """The newest migration's revision, read from the files' names: a migration's revision is its file's name
    (``NNNN_name.py``; only the first is ``0001``). tests/api/test_migrations.py holds this to Alembic's head."""
    return max(path.stem for path in (MIGRATIONS_DIR / "versions").glob("[0-9]*.py"))


def _at_newest(engine: Engine) -> bool:
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return False
        return [row[0] for row in conn.execute(sa.text("SELECT version_num FROM alembic_version"))] == [newest_migration()]


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` with Alembic; safe to call from several processes at once."""
    with _sqlite_file_lock(engine):
        # The common case at every start, answered without importing Alembic (a tenth of a second of every
        # API and worker start; a node's worker may restart often).
        if revision == "head" and _at_newest(engine):
            return
        _upgrade(engine, revision)


def _upgrade(engine: Engine, revision: str) -> None:
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn, _migration_lock(engine, conn):
        current = MigrationContext.configure(conn).get_current_revision()
        conn.commit()
        if current == head_revision() and revision == "head":
            return  # another process migrated while this one waited for the lock
        tables = set(sa.inspect(conn).get_table_names())
        if current is None and "jobs" in tables:
            # A database made by create_all before migrations existed holds the baseline schema: adopt it.
            log.info("database has tables but no migration history; stamping baseline %s", _BASELINE)
            cfg = _alembic_config()
            cfg.attributes["connection"] = conn
            command.stamp(cfg, _BASELINE)
            conn.commit()
        cfg = _alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()
        log.info("database schema upgraded from %s to %s", current or "empty", MigrationContext.configure(conn).get_current_revision())


def init_db(engine: Engine) -> None:
    """Create or upgrade the schema. One path for the API, the worker and tests: Alembic migrations."""
    migrate(engine)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.store.db", description="Manage the torchyard database schema.")
    parser.add_argument("action", choices=["upgrade", "current"], help="upgrade: migrate to head; current: print the revision")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = make_engine(get_settings().database_url)
    if args.action == "upgrade":
        migrate(engine)
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        log.info("revision %s (head %s)", MigrationContext.configure(conn).get_current_revision(), head_revision())


if __name__ == "__main__":
    main()
