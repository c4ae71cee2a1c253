"""Redis does not grow with use: every key the service writes is deleted when done or expires."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from jobs.settings import Settings
from tests.api.conftest import mlp_spec


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url  # what is counted lives in Redis; one database is enough


def test_submit_and_cancel_cycles_leave_no_lasting_key(client: TestClient, settings: Settings) -> None:
    redis = Redis.from_url(settings.redis_url)  # the test session's own redis-server, flushed for this test

    def cycle() -> None:
        job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
        assert client.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"

    def lasting() -> set[bytes]:
        return {key for key in redis.keys("*") if redis.ttl(key) == -1}

    cycle()  # the first registers the queue with RQ (rq:queues), a key that is meant to stay
    before, count = lasting(), redis.dbsize()
    for _ in range(100):
        cycle()
    assert lasting() == before
    assert redis.dbsize() <= count
