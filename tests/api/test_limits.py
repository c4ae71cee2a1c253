"""Request size limit, spec bounds and per-owner caps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from redis import Redis

from api.app import create_app
from jobs.scheduling import leader
from jobs.scheduling.scheduler import run_pass
from jobs.settings import Settings
from jobs.store.models import Status
from jobspec import catalog
from jobspec.spec import SPEC_ADAPTER
from tests.api.conftest import ADMIN, key_headers, mlp_spec, session_of, start_job


@pytest.fixture
def small(settings: Settings) -> Iterator[TestClient]:
    capped = settings.model_copy(update={"max_request_bytes": 2048, "max_queued_per_owner": 2, "max_running_per_owner": 1})
    with TestClient(create_app(capped), headers=ADMIN) as c:
        yield c


def test_oversized_body_is_413_before_it_is_read(small: TestClient) -> None:
    big = mlp_spec(labels={f"k{i}": "v" * 200 for i in range(20)})
    resp = small.post("/v1/jobs", content=json.dumps(big), headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert "2048" in resp.json()["detail"]

    # No Content-Length (chunked): refused as soon as the stream passes the limit, and the rest is never read.
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(1000):
            sent += 1
            yield b" " * 1024

    resp = small.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert small.get("/v1/jobs").json()["items"] == []
    # A body under the limit is fine.
    assert small.post("/v1/jobs", json=mlp_spec()).status_code == 201


def test_queued_cap_is_429_per_owner(small: TestClient, settings: Settings) -> None:
    alice = key_headers(small, "alice")
    first = [small.post("/v1/jobs", json=mlp_spec(), headers={**alice, "Idempotency-Key": f"k{i}"}).json() for i in range(2)]
    resp = small.post("/v1/jobs", json=mlp_spec(), headers=alice)
    assert resp.status_code == 429
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert "already has 2 queued jobs" in resp.json()["detail"] and "cap is 2" in resp.json()["detail"]
    assert int(resp.headers["Retry-After"]) > 0
    # Another owner is not affected.
    assert small.post("/v1/jobs", json=mlp_spec(), headers=key_headers(small, "bob")).status_code == 201
    # Once one starts there is room again; the running cap does not refuse submissions, it holds jobs in the queue.
    start_job(settings, first[0]["id"])
    third = small.post("/v1/jobs", json=mlp_spec(), headers=alice)
    assert third.status_code == 201
    with session_of(settings) as s:  # the scheduler's pass, under the app's caps
        assert leader.hold(s, leader.SCHEDULER, "test", settings.lease_ttl_s)
        run_pass(s, Redis.from_url(settings.redis_url), small.app.state.settings, "test")  # type: ignore[attr-defined]
    assert "running-job cap" in small.get(f"/v1/jobs/{third.json()['id']}", headers=alice).json()["waiting_reason"]
    assert small.post("/v1/jobs", json=mlp_spec(), headers=alice).status_code == 429
    # A replayed idempotent request still answers with its job when the owner is at the cap.
    replay = small.post("/v1/jobs", json=mlp_spec(), headers={**alice, "Idempotency-Key": "k1"})
    assert replay.status_code == 201 and replay.json()["id"] == first[1]["id"]


def _unbounded(schema: dict[str, Any], defs: dict[str, Any], where: str, out: set[str]) -> None:
    if "$ref" in schema:
        _unbounded(defs[schema["$ref"].split("/")[-1]], defs, where, out)
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            _unbounded(sub, defs, where, out)
    kind = schema.get("type")
    if kind in ("integer", "number"):
        low = "minimum" in schema or "exclusiveMinimum" in schema
        high = "maximum" in schema or "exclusiveMaximum" in schema
        if not (low and high):
            out.add(where)
    for name, sub in (schema.get("properties") or {}).items():
        _unbounded(sub, defs, f"{where}.{name}" if where else name, out)
    if isinstance(schema.get("items"), dict):
        _unbounded(schema["items"], defs, f"{where}[]", out)
    for sub in schema.get("prefixItems", []):
        _unbounded(sub, defs, f"{where}[]", out)


# Numeric fields the trainer's spec leaves unbounded; reported to trainer/ (a resnet with 10**9 blocks
# per stage passes validation). Remove an entry once the bound lands: this test then keeps it bounded.
KNOWN_UNBOUNDED: set[str] = set()
# Bounded by spec_problems rather than the schema (each beta in [0, 1)); tested below.
CHECKED_AFTER_PARSING = {"train.betas[]"}


def test_every_numeric_spec_field_is_bounded() -> None:
    found: set[str] = set()
    schema = SPEC_ADAPTER.json_schema()
    _unbounded(schema, schema.get("$defs", {}), "", found)
    for entries in (catalog.MODELS, catalog.DATASETS):
        for name, entry in entries.items():
            if isinstance(entry.args, type) and issubclass(entry.args, BaseModel):
                args = entry.args.model_json_schema()
                _unbounded(args, args.get("$defs", {}), f"{name}.args", found)
    missing = found - KNOWN_UNBOUNDED - CHECKED_AFTER_PARSING
    assert not missing, f"numeric spec fields without both bounds: {sorted(missing)}"


@pytest.mark.parametrize(("change", "field"), [
    ({"train": {"global_batch_size": 10**12}}, "train.global_batch_size"),
    ({"train": {"lr": 1e9}}, "train.lr"),
    ({"retries": 10**6}, "retries"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"timeout_s": 10**12}, "timeout_s"),
    ({"parallel": {"nnodes": 10**6}}, "parallel.nnodes"),
    ({"model": {"name": "mlp", "args": {"hidden": 10**9}}}, "model.args.hidden"),
    ({"data": {"name": "synthetic-classification", "args": {"samples": 10**12}}}, "data.args.samples"),
    ({"train": {"global_batch_size": 32, "betas": [2.0, 0.9]}}, "train.betas"),
])
def test_out_of_bounds_numbers_are_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    resp = client.post("/v1/jobs", json=mlp_spec(**change))
    assert resp.status_code == 422, resp.text
    assert any(field in e["field"] for e in resp.json()["errors"]), resp.json()


def test_query_numbers_are_bounded(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    for path, params in [("/v1/jobs", {"limit": 0}), ("/v1/jobs", {"limit": 10**6}),
                         (f"/v1/jobs/{job['id']}/metrics", {"limit": 10**9}),
                         (f"/v1/jobs/{job['id']}/metrics", {"since_step": -1}),
                         (f"/v1/jobs/{job['id']}/logs", {"tail": 0}), (f"/v1/jobs/{job['id']}/logs", {"rank": -1})]:
        resp = client.get(path, params=params)
        assert resp.status_code == 422, (path, params)
        assert resp.headers["content-type"].startswith("application/problem+json")
    assert Status.QUEUED.value == client.get(f"/v1/jobs/{job['id']}").json()["status"]
