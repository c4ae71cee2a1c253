"""Every route filters by owner: another owner's job answers 404, exactly like a missing one."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from jobs.settings import Settings
from jobs.store.models import Status
from tests.api.conftest import finish_job, key_headers, mlp_spec, start_job

JOB_ROUTES = [
    ("GET", ""), ("POST", "/cancel"), ("POST", "/retry"), ("GET", "/metrics"), ("GET", "/checkpoints"),
    ("GET", "/logs"), ("GET", "/logs?rank=0&follow=true"), ("GET", "/events"), ("GET", "/weights"),
    ("GET", "/checkpoints/10/weights"), ("GET", "/artifacts"), ("GET", "/artifacts/tensorboard/x"),
]


@pytest.mark.parametrize("finished", [False, True])
def test_another_owners_job_is_404_on_every_route(client: TestClient, settings: Settings, finished: bool) -> None:
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    job = client.post("/v1/jobs", json=mlp_spec(name="secret"), headers=alice).json()
    if finished:
        start_job(settings, job["id"])
        finish_job(settings, job["id"], Status.FAILED, reason="boom")
    for method, suffix in JOB_ROUTES:
        resp = client.request(method, f"/v1/jobs/{job['id']}{suffix}", headers=bob)
        assert resp.status_code == 404, (method, suffix, resp.text)
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["detail"] == f"job {job['id']} not found"
    # Nor does bob see it listed, by any filter; alice does.
    assert client.get("/v1/jobs", headers=bob).json()["items"] == []
    assert client.get("/v1/jobs", params={"name": "secret"}, headers=bob).json()["items"] == []
    assert [j["id"] for j in client.get("/v1/jobs", headers=alice).json()["items"]] == [job["id"]]
    # Nothing changed: bob's cancel and retry did nothing.
    after = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert after["status"] == ("failed" if finished else "queued")
    assert len(client.get("/v1/jobs", headers=alice).json()["items"]) == 1
