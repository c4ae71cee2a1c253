"""Alembic migrations: the schema at head matches the models, concurrent starts are safe, and a
database made by create_all before migrations existed is adopted."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import Session, SQLModel

from jobs.store.db import _BASELINE, _alembic_config, head_revision, init_db, make_engine, migrate, newest_migration
from jobs.store.models import Job
from tests.helpers import ROOT


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _drift(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(ctx, SQLModel.metadata)


def test_migrations_at_head_match_the_models(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        init_db(engine)
        assert _revision(engine) == head_revision()
        diff = _drift(engine)
        assert diff == [], (
            "jobs/store/models.py and the migrations differ; add a migration: "
            f"TORCHYARD_DATABASE_URL=... alembic revision --autogenerate -m '...'\n{diff}")
        # Down to nothing and up again: the downgrade path works too.
        cfg = _alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
        init_db(engine)
        assert _drift(engine) == []
    finally:
        engine.dispose()


def test_the_newest_migration_files_name_is_alembics_head() -> None:
    """Every start checks the schema against the newest file's name without importing Alembic: a migration whose
    revision is not its file's name would leave every start migrating, or a database behind."""
    assert newest_migration() == head_revision()


def test_a_start_at_head_imports_no_alembic(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        init_db(engine)
    finally:
        engine.dispose()
    probe = ("import sys; from jobs.settings import get_settings; from jobs.store.db import init_db, make_engine; "
             "init_db(make_engine(get_settings().database_url)); print(sorted(m for m in sys.modules if m.startswith('alembic')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "TORCHYARD_DATABASE_URL": database_url})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_concurrent_starts_migrate_once(database_url: str) -> None:
    engines = [make_engine(database_url) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(engines))

    def start(engine: sa.Engine) -> None:
        barrier.wait()
        try:
            init_db(engine)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert errors == []
        assert _revision(engines[0]) == head_revision()
        assert _drift(engines[0]) == []
    finally:
        for e in engines:
            e.dispose()


def test_a_create_all_database_is_adopted(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        # The schema as the code made it before migrations (create_all of the baseline's models, which
        # later migrations extend), with a job in it, and no migration history.
        migrate(engine, _BASELINE)
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE alembic_version"))
            conn.execute(sa.text("INSERT INTO jobs (id, owner, name, kind, status, queue, spec, labels, attempt, max_attempts, "
                                 "created_at, updated_at, last_seq, latest_metrics) VALUES ('legacy', 'admin', 'old', 'catalog', "
                                 "'queued', 'default', '{}', '{}', 1, 1, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 0, '{}')"))
        init_db(engine)
        assert _revision(engine) == head_revision()
        with Session(engine) as s:
            assert s.get(Job, "legacy") is not None
    finally:
        engine.dispose()


def test_alembic_command_line_sees_no_drift(sqlite_url: str) -> None:
    env = {**os.environ, "TORCHYARD_DATABASE_URL": sqlite_url}
    for args in (["upgrade", "head"], ["check"]):
        result = subprocess.run([sys.executable, "-m", "alembic", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
