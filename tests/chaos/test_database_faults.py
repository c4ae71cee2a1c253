"""PostgreSQL restarts under a running job (a failover, an operator's restart): nothing is lost or doubled.

The database is the test's own (initdb + pg_ctl on a free port), so it can be stopped and started."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from jobs.store.models import Checkpoint
from tests import postgres_server
from tests.chaos.conftest import alive, assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.conftest import make_settings
from tests.helpers import Services, tree, wait_until
from worker.sandbox.processes import marked_processes

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not postgres_server.available(), reason="initdb/pg_ctl (and a postgres user when root) needed")]


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


def _postgres_processes(server: postgres_server.PostgresServer) -> list[psutil.Process]:
    postmaster = int((server.data / "postmaster.pid").read_text().splitlines()[0])
    return tree(postmaster)


def test_database_frozen_mid_job_the_watchdog_stops_the_ranks_before_the_lease_lapses(
        services: Services, settings: Settings, own_postgres: postgres_server.PostgresServer) -> None:
    """PostgreSQL stopped dead (SIGSTOP: connections stay open, nothing answers) hangs the supervisor's database
    call; its watchdog thread still stops the ranks within 0.8 of the lease, so nothing of this attempt runs
    on once another worker may take the job over."""
    steps = 60
    services.start_api()
    services.start_worker("only", **faults(slow(0.15)))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(steps, retries=0)).json()["id"]
        wait_step(services, client, job_id, 8)
        running = marked_processes(job_id, attempt=1)
        assert running
        frozen = _postgres_processes(own_postgres)
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        try:
            # Each process of the attempt looked up by its pid, not a scan of every process's environment (which
            # took most of the margin on a loaded machine): the time measured is the watchdog's.
            wait_until(lambda: not alive(running), 60, interval_s=0.02, what="the watchdog to stop the ranks")
            stopped_after = time.monotonic() - began
        finally:
            for proc in frozen:
                proc.send_signal(signal.SIGCONT)
        assert marked_processes(job_id, attempt=1) == []  # and none of the attempt started meanwhile
        assert stopped_after < settings.lease_ttl_s, f"ranks ran {stopped_after:.1f}s without a lease"
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=180)
        # Requeued as a lost worker (no retry spent) and resumed: still every step once.
        assert_nothing_lost(client, job, steps)
        assert job["attempt"] == 2
    assert [a.outcome for a in attempts(settings, job_id)] == ["lost", "succeeded"]
