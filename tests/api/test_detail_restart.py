"""GET /v1/jobs/{id} reads PostgreSQL on connections of its own without a pre-ping: a restart of the database
must cost no failed request, and a database that is down answers 503 as on every other route."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from tests import postgres_server
from tests.api.conftest import ADMIN, mlp_spec, start_job
from tests.conftest import make_settings

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not postgres_server.available(), reason="needs initdb and pg_ctl")]


@pytest.fixture
def settings(tmp_path: Path, own_postgres: postgres_server.PostgresServer, redis_url: str) -> Settings:
    s = make_settings(tmp_path, own_postgres.url, redis_url)
    init_db(get_engine(s.database_url))
    return s


def test_detail_answers_across_a_postgres_restart(settings: Settings, own_postgres: postgres_server.PostgresServer) -> None:
    with TestClient(create_app(settings), headers=ADMIN) as client:
        queued = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
        running = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
        start_job(settings, running)
        for job_id in (queued, running):  # the reader's connections are open now
            assert client.get(f"/v1/jobs/{job_id}").status_code == 200
        own_postgres.restart(down_s=0.2)
        # Every connection was cut: the first read on a dead one reads again on a new one.
        after = [client.get(f"/v1/jobs/{job_id}") for job_id in (running, running, queued)]
        assert [r.status_code for r in after] == [200, 200, 200]
        assert after[0].json()["status"] == "running" and after[2].json()["status"] == "queued"
        own_postgres.stop()
        down = client.get(f"/v1/jobs/{running}")
        assert down.status_code == 503 and down.headers["Retry-After"] == "5"
        own_postgres.start()
        assert client.get(f"/v1/jobs/{running}").json()["status"] == "running"
