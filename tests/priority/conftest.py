"""Priority, quotas and preemption on real processes: SQLite, and a short stop grace so preempted jobs leave soon.

The lease stays at the suite's default (10 s): a preemption hands GPUs from one job to another within seconds,
and a shorter lease would let a loaded machine's slow adoption read as a lost worker (one more attempt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from tests.conftest import make_settings


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def settings(tmp_path: Path, database_url: str, redis_url: str) -> Settings:
    s = make_settings(tmp_path, database_url, redis_url, stop_grace_s=8.0)
    init_db(get_engine(s.database_url))
    return s
