"""Tenant API keys: created, listed and revoked by the admin; stored hashed."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from jobs.settings import Settings
from jobs.store.models import ApiKey
from tests.api.conftest import ADMIN, key_headers, mlp_spec, session_of


def test_admin_creates_lists_and_revokes_keys(client: TestClient, settings: Settings) -> None:
    resp = client.post("/v1/keys", json={"owner": "alice", "name": "laptop"})
    assert resp.status_code == 201, resp.text
    created = resp.json()
    assert set(created) == {"id", "owner", "name", "key", "created_at", "revoked_at", "queues", "max_priority", "may_protect"}
    assert created["owner"] == "alice" and created["key"].startswith("ty_")
    alice = {"Authorization": f"Bearer {created['key']}"}

    job = client.post("/v1/jobs", json=mlp_spec(), headers=alice).json()
    assert job["owner"] == "alice"

    listed = client.get("/v1/keys").json()["items"]
    assert [(k["id"], k["owner"], k["revoked_at"]) for k in listed] == [(created["id"], "alice", None)]
    assert "key" not in listed[0] and "key_hash" not in listed[0]

    # Only a digest is stored, never the key.
    with session_of(settings) as s:
        row = s.get(ApiKey, created["id"])
        assert row is not None and created["key"] not in row.key_hash and len(row.key_hash) == 64
        assert created["key"] not in str(s.exec(sa.select(ApiKey.__table__)).all())  # type: ignore[call-overload]

    assert client.delete(f"/v1/keys/{created['id']}").status_code == 204
    revoked = client.get("/v1/jobs", headers=alice)
    assert revoked.status_code == 401
    assert revoked.headers["content-type"].startswith("application/problem+json")
    assert client.get("/v1/keys").json()["items"][0]["revoked_at"] is not None
    assert client.delete(f"/v1/keys/{created['id']}").status_code == 204  # revoking twice is harmless
    assert client.delete("/v1/keys/nope").status_code == 404
    # The admin token keeps working and still owns its own jobs only.
    assert client.get("/v1/jobs").json()["items"] == []


def test_keys_are_admin_only_and_validated(client: TestClient) -> None:
    bob = key_headers(client, "bob")
    for method, path, body in [("POST", "/v1/keys", {"owner": "eve", "name": "x"}), ("GET", "/v1/keys", None),
                               ("DELETE", "/v1/keys/whatever", None)]:
        resp = client.request(method, path, json=body, headers=bob)
        assert resp.status_code == 403, (method, path)
        assert resp.headers["content-type"].startswith("application/problem+json")
    assert client.post("/v1/keys", json={"owner": "admin", "name": "x"}).status_code == 422
    assert client.post("/v1/keys", json={"owner": "has space", "name": "x"}).status_code == 422
    assert client.post("/v1/keys", json={"owner": "carol"}).status_code == 422


def test_wrong_keys_are_refused(client: TestClient) -> None:
    good = key_headers(client, "dave")["Authorization"].removeprefix("Bearer ")
    tampered = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    for token in (tampered, "ty_0000000000000000_secret", "ty_", "ty_short_x", good + "x"):
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 401, token
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {good}"}).status_code == 200
    assert client.get("/v1/jobs", headers=ADMIN).status_code == 200
