"""A supervisor that froze past its lease, and a worker whose clock is off: the lease, not luck, decides.

The frozen supervisor is SIGSTOPped with its whole worker (a paused VM); on SIGCONT the job runs a newer
attempt on another worker of the same host. The stale one must write nothing, kill nothing of the new
attempt (kill marks are per attempt) and exit."""

from __future__ import annotations

import signal

import psutil
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Transition
from tests.chaos.conftest import alive, assert_nothing_lost, attempts, faults, slow, spec, wait_step
from tests.helpers import Services, tree, wait_until
from worker.sandbox.processes import marked_processes

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def database_url(postgres_url: str) -> str:
    # Workers that freeze and wake while others go on are several hosts' workers, which share a PostgreSQL
    # (docs/deploy.md). On SQLite a worker frozen inside a write holds the file's one write lock, so no other
    # worker could requeue anything until it wakes; PostgreSQL ends such a session (tests/jobs/test_frozen_writer.py).
    return postgres_url


def transitions(settings: Settings, job_id: str) -> list[tuple[str, str, int]]:
    with Session(get_engine(settings.database_url)) as session:
        rows = session.exec(sa.select(Transition).where(Transition.job_id == job_id).order_by(Transition.id)).scalars()  # type: ignore[call-overload]
        return [(t.from_status, t.to_status, t.attempt) for t in rows]


def test_supervisor_frozen_past_its_lease_writes_and_kills_nothing_when_it_wakes(services: Services, settings: Settings) -> None:
    services.start_api()
    # Frozen inside a write, the stale worker's session is ended by the server after this limit (the default, 300 s,
    # is longer than this test waits).
    idle = {"TORCHYARD_DB_IDLE_IN_TRANSACTION_TIMEOUT_S": "20"}
    stale = services.start_worker("stale", **idle, **faults(slow(0.15)))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(80, retries=0)).json()["id"]
        reached = wait_step(services, client, job_id, 8)["last_step"]
        frozen = tree(stale.pid)
        horse = [p for p in psutil.Process(stale.pid).children() if p.pid != stale.pid]
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        # 0.5 s a step: attempt 2 has half a minute left after the step the test waits for, far past the stale
        # supervisor's wake and exit on a loaded machine (0.15 s left 10 s), so the job is still running when checked.
        services.start_worker("fresh", **idle, **faults(slow(0.5)))
        # The lease lapses (3 s), a reconciler requeues the job as attempt 2 and the fresh worker runs it.
        wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["attempt"] == 2, 120, what="attempt 2")
        wait_step(services, client, job_id, reached + 6)
        newer = marked_processes(job_id, attempt=2)
        assert newer
        # Wake the stale worker and its supervisor (its ranks stay stopped: they would only race the new attempt).
        for proc in [psutil.Process(stale.pid), *horse]:
            proc.send_signal(signal.SIGCONT)
        wait_until(lambda: not alive(horse), 60,
                   what="the stale supervisor to exit")
        wait_until(lambda: marked_processes(job_id, attempt=1) == [], 30, what="the stale attempt's processes to die")
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"
        assert all(p.is_running() for p in newer), "the stale supervisor killed processes of the new attempt"
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=180)
        assert_nothing_lost(client, job, 80)
        assert job["attempt"] == 2
    # The stale supervisor wrote nothing: the lapse's requeue and the new attempt's own changes only.
    assert transitions(settings, job_id) == [("queued", "running", 1), ("running", "queued", 2),
                                             ("queued", "running", 2), ("running", "succeeded", 2)]
    assert [a.outcome for a in attempts(settings, job_id)] == ["lost", "succeeded"]
    log = (services.logs / "stale.log").read_text(errors="replace")
    # It woke to a fenced write, or its lease watchdog (past 0.8 TTL) fired first, or (its ranks ended meanwhile by
    # the fresh worker's sweep of lapsed attempts, worker/sandbox/leftovers.py) its verdict's write was refused by the fence:
    # either way it gave up, and the transitions above show it wrote nothing.
    assert ("lost ownership" in log or "stopping this attempt's processes" in log or "lease not renewed" in log
            or f"job {job_id}: fail refused" in log)


def test_worker_clock_60s_behind_keeps_its_job(services: Services, settings: Settings) -> None:
    services.start_api()
    services.start_worker("skewed", TORCHYARD_CLOCK_OFFSET_S="-60", **faults(slow(0.1)))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(40)).json()["id"]
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=180)
        # Leases are stamped by the database: a lease stamped by the worker's clock would have lapsed at once.
        assert_nothing_lost(client, job, 40)
        assert job["attempt"] == 1
    assert [a.outcome for a in attempts(settings, job_id)] == ["succeeded"]
