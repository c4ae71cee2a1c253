"""Verified tenant keys are trusted for at most TORCHYARD_KEY_CACHE_S: a key revoked elsewhere (another API
process, straight in SQL) stops working within that bound, and at once in the process that revoked it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from api.app import create_app
from jobs.infra import keys
from jobs.store.db import get_engine, init_db
from tests.api.conftest import ADMIN
from tests.conftest import make_settings


def _client(tmp_path: Path, sqlite_url: str, redis_url: str, cache_s: float) -> TestClient:
    settings = make_settings(tmp_path, sqlite_url, redis_url, key_cache_s=cache_s)
    init_db(get_engine(settings.database_url))
    return TestClient(create_app(settings), headers=ADMIN)


def _revoke_elsewhere(client: TestClient, key_id: str) -> None:
    # What another API process does: the row changes, this process's cache is not told.
    with Session(client.app.state.engine) as session:  # type: ignore[attr-defined]
        keys.revoke_key(session, key_id)


@pytest.mark.parametrize("cache_s", [0.0, 1.5])
def test_a_key_revoked_elsewhere_stops_working_within_the_cache_bound(
        tmp_path: Path, sqlite_url: str, redis_url: str, cache_s: float) -> None:
    with _client(tmp_path, sqlite_url, redis_url, cache_s) as client:
        made = client.post("/v1/keys", json={"owner": "alice", "name": "k"}).json()
        alice = {"Authorization": f"Bearer {made['key']}"}
        assert client.get("/v1/jobs", headers=alice).status_code == 200  # verified, and cached when cache_s > 0
        cached_by = time.monotonic()  # the key's cache entry, if any, was made before this
        _revoke_elsewhere(client, made["id"])
        # A request that starts once the entry's time is up is refused; one that started before may still pass,
        # however long a loaded machine takes to answer it.
        while True:
            started = time.monotonic()
            if client.get("/v1/jobs", headers=alice).status_code != 200:
                break
            late = started - cached_by
            assert started < cached_by + cache_s, f"a revoked key still works {late:.2f} s after it was cached for {cache_s} s"
            time.sleep(0.1)
        assert client.get("/v1/jobs", headers=alice).status_code == 401


def test_revoking_through_this_process_takes_effect_at_once_despite_the_cache(
        tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    with _client(tmp_path, sqlite_url, redis_url, cache_s=300) as client:
        made = client.post("/v1/keys", json={"owner": "alice", "name": "k"}).json()
        alice = {"Authorization": f"Bearer {made['key']}"}
        assert client.get("/v1/jobs", headers=alice).status_code == 200
        assert client.delete(f"/v1/keys/{made['id']}").status_code == 204
        assert client.get("/v1/jobs", headers=alice).status_code == 401
        # A wrong key with a live key's id is refused however much is cached.
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {made['key']}x"}).status_code == 401
