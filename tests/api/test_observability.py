"""Prometheus /metrics, structured logs with job ids and request ids, /readyz failing per dependency."""

from __future__ import annotations

import json
import logging

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from jobs.infra import logconfig
from jobs.settings import Settings
from stack.redis_server import free_port
from tests.api.conftest import ADMIN, ingest, metric_event, mlp_spec, start_job


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def test_metrics_cover_jobs_queues_dispatch_ingest_and_requests(client: TestClient, settings: Settings) -> None:
    settings.queues = ["default", "other"]
    jobs = [client.post("/v1/jobs", json=mlp_spec()).json()["id"] for _ in range(3)]
    assert client.post("/v1/jobs", json=mlp_spec(queue="other")).status_code == 201
    start_job(settings, jobs[0])
    ingest(settings, jobs[0], [metric_event(1, 10), metric_event(2, 20)])
    m = scrape(client)
    assert m[("torchyard_jobs", (("status", "queued"),))] == 3
    assert m[("torchyard_jobs", (("status", "running"),))] == 1
    assert m[("torchyard_jobs", (("status", "failed"),))] == 0
    assert m[("torchyard_queue_depth", (("queue", "default"),))] == 2  # queued in SQL: the started one is not
    assert m[("torchyard_queue_depth", (("queue", "other"),))] == 1
    assert m[("torchyard_events_ingested_total", ())] == 2
    assert m[("torchyard_dispatch_latency_seconds_count", ())] == 1
    assert m[("torchyard_dispatch_latency_seconds_bucket", (("le", "+Inf"),))] == 1
    key = ("torchyard_http_request_duration_seconds_count", (("method", "POST"), ("route", "/v1/jobs"), ("status", "201")))
    assert m[key] == 4
    # Labelled by route template, not by raw path: one series for every job id.
    client.get(f"/v1/jobs/{jobs[1]}")
    client.get(f"/v1/jobs/{jobs[2]}")
    m = scrape(client)
    assert m[("torchyard_http_request_duration_seconds_count",
              (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "200")))] == 2
    # Dispatches are counted once, not again at every scrape.
    assert m[("torchyard_dispatch_latency_seconds_count", ())] == 1


def test_logs_are_json_lines_with_job_and_request_ids(client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    logconfig.configure("INFO", "json")
    try:
        resp = client.post("/v1/jobs", json=mlp_spec(), headers={"X-Request-ID": "req-42"})
        assert resp.headers["X-Request-ID"] == "req-42"
        job_id = resp.json()["id"]
        client.get(f"/v1/jobs/{job_id}")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    finally:
        logging.getLogger().handlers.clear()
    submitted = [r for r in lines if r["logger"] == "jobs.lifecycle.submission" and "submitted" in r["message"]]
    assert submitted and submitted[0]["job_id"] == job_id and submitted[0]["request_id"] == "req-42"
    access = [r for r in lines if r["logger"] == "api.access"]
    assert {(r["method"], r["route"], r["status"]) for r in access} >= {("POST", "/v1/jobs", 201), ("GET", "/v1/jobs/{job_id}", 200)}
    get = next(r for r in access if r["method"] == "GET")
    assert get["job_id"] == job_id and get["owner"] == "admin" and get["duration_ms"] >= 0 and get["request_id"]


def test_readyz_fails_when_redis_does_not_answer(settings: Settings) -> None:
    broken = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    with TestClient(create_app(broken), headers=ADMIN) as c:
        resp = c.get("/readyz")
        assert resp.status_code == 503
        assert resp.json() == {"status": "unavailable", "checks": {"database": "ok", "redis": "error: ConnectionError"}}
        # A job is still accepted while Redis is down: SQL is the truth, and the scheduler reads it from there.
        job = c.post("/v1/jobs", json=mlp_spec())
        assert job.status_code == 201, job.text
        assert job.json()["status"] == "queued" and job.json()["waiting_reason"] is None
        assert c.get("/metrics").status_code == 200  # every figure comes from SQL


def test_readyz_fails_when_sql_does_not_answer(client: TestClient) -> None:
    good = client.app.state.engine  # type: ignore[attr-defined]
    client.app.state.engine = sa.create_engine(  # type: ignore[attr-defined]
        f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none", connect_args={"connect_timeout": 2})
    try:
        resp = client.get("/readyz")
        assert resp.status_code == 503
        assert resp.json()["checks"] == {"database": "error: OperationalError", "redis": "ok"}
    finally:
        client.app.state.engine = good  # type: ignore[attr-defined]
