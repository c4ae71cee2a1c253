"""Idempotency-Key on POST /v1/jobs."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from jobs.settings import Settings
from tests.api.conftest import key_headers, mlp_spec


def _jobs(client: TestClient, headers: dict[str, str] | None = None) -> list[str]:
    return [j["id"] for j in client.get("/v1/jobs", headers=headers or {}).json()["items"]]


def test_same_key_and_body_return_the_same_job(client: TestClient, settings: Settings) -> None:
    first = client.post("/v1/jobs", json=mlp_spec(), headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    # Same body, keys in another order: the same request.
    reordered = dict(reversed(list(mlp_spec().items())))
    again = client.post("/v1/jobs", json=reordered, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert _jobs(client) == [first.json()["id"]]
    # Without a key every POST is a new job.
    assert client.post("/v1/jobs", json=mlp_spec()).json()["id"] != first.json()["id"]


def test_same_key_with_another_body_is_422(client: TestClient) -> None:
    first = client.post("/v1/jobs", json=mlp_spec(), headers={"Idempotency-Key": "k-2"}).json()
    resp = client.post("/v1/jobs", json=mlp_spec(name="other"), headers={"Idempotency-Key": "k-2"})
    assert resp.status_code == 422
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert "Idempotency-Key" in resp.json()["detail"] and first["id"] in resp.json()["detail"]
    assert _jobs(client) == [first["id"]]


def test_keys_are_scoped_to_the_owner(client: TestClient) -> None:
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    a = client.post("/v1/jobs", json=mlp_spec(), headers={**alice, "Idempotency-Key": "shared"}).json()
    b = client.post("/v1/jobs", json=mlp_spec(name="bobs"), headers={**bob, "Idempotency-Key": "shared"})
    assert b.status_code == 201 and b.json()["id"] != a["id"] and b.json()["owner"] == "bob"


def test_concurrent_duplicates_create_one_job(client: TestClient, settings: Settings) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[tuple[int, str]] = []

    def post() -> None:
        barrier.wait()
        resp = client.post("/v1/jobs", json=mlp_spec(), headers={"Idempotency-Key": "race"})
        results.append((resp.status_code, resp.json().get("id", resp.text)))

    threads = [threading.Thread(target=post) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == n
    assert {code for code, _ in results} == {201}, results
    assert len({job_id for _, job_id in results}) == 1
    assert _jobs(client) == [results[0][1]]


def test_key_is_validated(client: TestClient) -> None:
    for bad in ("", "x" * 256, "has space"):
        resp = client.post("/v1/jobs", json=mlp_spec(), headers={"Idempotency-Key": bad})
        assert resp.status_code == 422, bad
    assert _jobs(client) == []
