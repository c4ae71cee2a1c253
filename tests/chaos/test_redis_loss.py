"""Redis is a carrier, not the record: killed and restarted empty, no job is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from stack.redis_server import RedisServer
from tests.chaos.conftest import assert_nothing_lost, faults, slow, spec, wait_step
from tests.chaos.test_gang import GANG_ENV, assert_finished, gang_spec
from tests.conftest import make_settings
from tests.helpers import Services

TERMINAL = {"succeeded", "failed", "cancelled"}

pytestmark = pytest.mark.slow


@pytest.fixture
def own_redis(tmp_path: Path) -> RedisServer:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def settings(tmp_path: Path, database_url: str, own_redis: RedisServer) -> Settings:
    s = make_settings(tmp_path, database_url, own_redis.url, lease_ttl_s=3.0, stop_grace_s=8.0)
    init_db(get_engine(s.database_url))
    return s


def test_redis_restarted_empty_while_jobs_queue_and_run(services: Services, own_redis: RedisServer) -> None:
    services.start_api()
    services.start_worker("only", **faults(slow(0.1)))
    with services.client() as client:
        running = client.post("/v1/jobs", json=spec(40)).json()["id"]
        waiting = [client.post("/v1/jobs", json=spec(10)).json()["id"]]
        wait_step(services, client, running, 5)
        own_redis.stop()
        own_redis.start()  # same port, nothing in it: the queue and RQ's bookkeeping are gone
        jobs = {job_id: services.wait_status(client, job_id, TERMINAL, timeout_s=180) for job_id in [running, *waiting]}
        assert_nothing_lost(client, jobs[running], 40)
        for job_id in waiting:
            assert_nothing_lost(client, jobs[job_id], 10)


def test_redis_restarted_empty_mid_two_node_job(services: Services, own_redis: RedisServer) -> None:
    """Gang heartbeats, the round's state and RQ's bookkeeping all vanish; the nodes' Redis calls ride out the
    restart and a heartbeat missing once is not a lost node, so the gang trains on."""
    services.start_api()
    services.start_worker("node-a", **GANG_ENV, **faults(slow(0.1)))
    services.start_worker("node-b", **GANG_ENV, **faults(slow(0.1)))
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=gang_spec(40)).json()["id"]
        wait_step(services, client, job_id, 5)
        own_redis.stop()
        own_redis.start()
        job = services.wait_status(client, job_id, TERMINAL, timeout_s=240)
        assert_finished(client, job, 40, 2)
