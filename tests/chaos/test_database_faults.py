"""PostgreSQL restarts under a running job (a failover, an operator's restart): nothing is lost or doubled.

The database is the test's own (initdb + pg_ctl on a free port), so it can be stopped and started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.db import get_engine, init_db
from jobs.models import Checkpoint
from jobs.settings import Settings
from tests import postgres_server
from tests.chaos.conftest import assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.conftest import make_settings
from tests.helpers import Services

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.skipif(not postgres_server.available(), reason="initdb/pg_ctl (and a postgres user when root) needed")


@pytest.fixture
def own_postgres() -> Iterator[postgres_server.PostgresServer]:
    server = postgres_server.PostgresServer().init().start()
    yield server
    get_engine.cache_clear()
    server.destroy()


@pytest.fixture
def settings(tmp_path: Path, own_postgres: postgres_server.PostgresServer, redis_url: str) -> Settings:
    # The default 10 s lease: a restart must be ridden out by retries, not by the lease's expiry.
    s = make_settings(tmp_path, own_postgres.url, redis_url, stop_grace_s=8.0)
    init_db(get_engine(s.database_url))
    return s


def checkpoint_rows(settings: Settings, job_id: str) -> set[int]:
    with Session(get_engine(settings.database_url)) as session:
        return set(session.exec(sa.select(Checkpoint.step).where(Checkpoint.job_id == job_id)).scalars())  # type: ignore[call-overload]


def test_postgres_restarted_twice_mid_job_stores_every_step_once(
        services: Services, settings: Settings, own_postgres: postgres_server.PostgresServer) -> None:
    steps = 60
    services.start_api()
    services.start_worker("only", **faults(slow(0.15)))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(steps, retries=0)).json()["id"]
        wait_step(services, client, job_id, 10)
        own_postgres.restart(down_s=0.2)
        wait_step(services, client, job_id, 30)
        own_postgres.restart(down_s=0.2)
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=180)
        # Every step 1..N exactly once, the job finished in its first attempt (a blip is not a lost worker).
        assert_nothing_lost(client, job, steps)
        assert job["attempt"] == 1
    assert [a.outcome for a in attempts(settings, job_id)] == ["succeeded"]
    on_disk = {int(p.name.removeprefix("step_")) for p in (settings.runs_dir / job_id / "checkpoints").glob("step_*")}
    assert on_disk and on_disk <= checkpoint_rows(settings, job_id)
