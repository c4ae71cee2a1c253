"""Fresh databases for tests, without paying for a new one each time.

PostgreSQL: ``CREATE DATABASE`` copies template1 through the write-ahead log and ``DROP DATABASE`` removes every
file; beside a second suite that cost 0.5-1 s of the server's time per test, a quarter of the quick loop. A database
a test is done with is instead emptied (its schemas dropped, what ``CREATE DATABASE`` leaves put back) and kept for
this process's next test. It is renamed first, after its connections are cut: a process the test left behind that
reconnects finds no database of that name, as it would after a drop, and never writes into the next test's one.
Names carry the test process's pid: what a killed process kept is dropped by the next one to start (another suite
running beside this one on the same server keeps its own).

A test that asks for the service's schema (the ``settings`` fixtures) is given a database left at that schema by an
earlier test, with its rows deleted and its sequences restarted: 5 ms where the migrations take 200.

SQLite: the migrated schema is built once per process and copied (``migrated``), in place of running every
migration for each test that asks for the service's schema.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
from functools import lru_cache
from pathlib import Path

import psutil
import psycopg
import sqlalchemy as sa
from sqlmodel import SQLModel

from jobs.store.db import get_engine, head_revision, init_db, make_engine

SERVER = "postgres@127.0.0.1:5432"  # the tests' PostgreSQL (trust auth); its database `test` is the admin's
_PREFIX = "torchyard_test_"
# This process's emptied databases, each under a name no test has used: as CREATE DATABASE makes them, and at the
# service's schema with no rows.
_spare: dict[bool, list[str]] = {False: [], True: []}


def _new_name() -> str:
    return f"{_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"


@lru_cache(maxsize=1)
def _drop_what_dead_processes_kept() -> None:
    """Once per process: drop the databases of test processes that are gone (killed before their at-exit cleanup)."""
    with _admin() as admin:
        names = [row[0] for row in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{_PREFIX}%",))]
        for name in names:
            pid = name.removeprefix(_PREFIX).split("_", 1)[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def url_of(name: str) -> str:
    """The service's (SQLAlchemy's) URL of database ``name``."""
    return f"postgresql+psycopg://{SERVER}/{name}"


def _connect(name: str, **kwargs: object) -> psycopg.Connection:
    return psycopg.connect(f"postgresql://{SERVER}/{name}", autocommit=True, **kwargs)


def _admin() -> psycopg.Connection:
    return _connect("test")


def postgres_answers() -> bool:
    """Whether the tests' PostgreSQL is there to use."""
    try:
        with _connect("test", connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def take_postgres(migrated: bool = False) -> str:
    """The name of a database no other test uses: as ``CREATE DATABASE`` makes it, or, where one is at hand and
    ``migrated``, at the service's schema with no rows (the caller still runs ``init_db``, which finds it at head)."""
    _drop_what_dead_processes_kept()
    for pool in ([_spare[True]] if migrated else []) + [_spare[False]]:
        if pool:
            return pool.pop()
    name = _new_name()
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name


def give_back_postgres(name: str) -> None:
    """Cut ``name``'s connections, rename it, empty it and keep it for the next test; drop it where that fails."""
    get_engine.cache_clear()
    fresh = _new_name()
    with _admin() as admin:
        # A backend ends a moment after it is told to; a left-behind process may also reconnect in between.
        for _ in range(100):
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            try:
                admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{fresh}"')
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.05)
        else:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
    try:
        with _connect(fresh) as conn:
            migrated = _at_head(conn)
            if migrated:
                _delete_rows(conn)
            else:
                _drop_schemas(conn)
    except psycopg.Error:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
        return
    _spare[migrated].append(fresh)


def _at_head(conn: psycopg.Connection) -> bool:
    """Whether the database holds the service's schema at head and nothing else."""
    tables = {(row[0], row[1]) for row in conn.execute(
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema NOT IN ('pg_catalog', 'information_schema')")}
    if tables != {("public", name) for name in SQLModel.metadata.tables} | {("public", "alembic_version")}:
        return False
    return [row[0] for row in conn.execute("SELECT version_num FROM alembic_version")] == [head_revision()]


def _delete_rows(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")  # no foreign-key order to follow
        for name in SQLModel.metadata.tables:
            conn.execute(f'DELETE FROM "{name}"')
        for (sequence,) in conn.execute("SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'").fetchall():
            conn.execute(f'ALTER SEQUENCE "{sequence}" RESTART')


def _drop_schemas(conn: psycopg.Connection) -> None:
    schemas = [row[0] for row in conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'")]
    for schema in schemas:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    # What CREATE DATABASE leaves on PostgreSQL 15 and later.
    conn.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
    conn.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")


@atexit.register
def _drop_spares() -> None:
    names = _spare[False] + _spare[True]
    if not names:
        return
    with _admin() as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@lru_cache(maxsize=1)
def _sqlite_template() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="torchyard-schema-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "migrated.db"
    engine = make_engine(f"sqlite:///{path}")
    init_db(engine)
    engine.dispose()  # the last connection's close folds the write-ahead log into the file: the file is all of it
    assert not Path(f"{path}-wal").exists(), "the template's write-ahead log was not folded into it"
    return path


def migrated(url: str) -> None:
    """Bring the database at ``url`` to the service's schema, as ``init_db`` does: a SQLite file that does not exist
    yet is copied from this process's migrated one (created 0600, as the service creates it)."""
    path = sa.engine.make_url(url).database if url.startswith("sqlite") else None
    if path and path != ":memory:" and not Path(path).exists():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with _sqlite_template().open("rb") as src, os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as dst:
            shutil.copyfileobj(src, dst)
        return
    init_db(get_engine(url))
