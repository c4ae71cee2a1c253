"""Shared fixtures: a private redis-server, a fresh database per test (SQLite, and PostgreSQL
when it answers), settings pointing at temporary directories, and real service processes."""

from __future__ import annotations

import os
import sys

# Byte code is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE, as in our images): without the
# cache each xdist process rewrote all 470 test modules again (collection 17.5 CPU-s instead of 11.7), and every API,
# worker and rank the suite starts compiled the project's modules again. __pycache__ is ignored by git.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# pytest-xdist's workers set COLUMNS=80, where the CLI (its own process, or in-process through CliRunner) prints
# its plain-output width (160) to a pipe: the tests read what a user piping the CLI gets. Before any cli import.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from jobs.settings import Settings
from jobs.store.db import get_engine
from stack.redis_server import RedisServer
from tests import databases, postgres_server, quick_examples, slowest_files

# Hooks: the longest test files start first (xdist hands out whole files in collection order).
from tests.file_order import pytest_addoption, pytest_collection_modifyitems  # noqa: F401
from tests.helpers import ADMIN_TOKEN, Services

# Hooks: the quick selection (-m "not slow") fails any test that starts torchrun.
from tests.torchrun_guard import pytest_deselected, pytest_runtest_call  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    slowest_files.pytest_configure(config)  # every run prints its 20 slowest test files before pytest's final line
    quick_examples.configure(config)  # fewer Hypothesis examples in the quick loop (-m "not slow")


POSTGRES = databases.postgres_answers()


@pytest.fixture
def own_postgres() -> Iterator[postgres_server.PostgresServer]:
    """A private PostgreSQL cluster the test may stop, restart or freeze (``initdb``/``pg_ctl``)."""
    server = postgres_server.PostgresServer().init().start()
    yield server
    get_engine.cache_clear()
    server.destroy()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    Redis.from_url(redis_server.url).flushall()
    return redis_server.url


def _postgres_database(migrated: bool = False) -> Iterator[str]:
    name = databases.take_postgres(migrated)
    try:
        yield databases.url_of(name)
    finally:
        databases.give_back_postgres(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that asks for it runs once per database; PostgreSQL only where it answers."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'torchyard.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database, for tests of what only a database server does (several hosts' workers)."""
    if not POSTGRES:
        pytest.skip("PostgreSQL does not answer at 127.0.0.1:5432")
    # A test with a `settings` fixture gets the service's schema (init_db): a database left at it is handed out.
    yield from _postgres_database(migrated="settings" in request.fixturenames)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'torchyard.db'}"


def make_settings(tmp_path: Path, database_url: str, redis_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url, "redis_url": redis_url, "runs_dir": tmp_path / "runs", "data_dir": tmp_path / "data",
        "code_dir": tmp_path / "code", "admin_token": ADMIN_TOKEN, "max_nproc_per_node": 4,
        "lease_ttl_s": 10.0, "poll_interval_s": 0.5, "stop_grace_s": 20.0, "single_user": True,
    }
    values.update(overrides)
    for key in ("runs_dir", "data_dir", "code_dir"):
        Path(values[key]).mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    s = make_settings(tmp_path, database_url, redis_url)
    databases.migrated(s.database_url)
    return s


@pytest.fixture
def services(tmp_path: Path, settings: Settings) -> Iterator[Services]:
    svc = Services(settings, tmp_path / "service-logs")
    try:
        yield svc
    finally:
        svc.stop()
