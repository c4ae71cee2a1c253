"""The admin runs the box: every owner's job is one it can find, read, cancel, reprioritise and delete by id, and list
with ``owner``; a tenant key still reaches its own owner's jobs only."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from jobs.settings import Settings
from jobs.store.ingest import ingest_events
from jobs.store.models import Job
from tests.api.conftest import key_headers, metric_event, mlp_spec, session_of, start_job


def test_the_admin_reads_and_acts_on_a_tenants_jobs(client: TestClient, settings: Settings) -> None:
    alice = key_headers(client, "alice")
    running = client.post("/v1/jobs", json=mlp_spec(name="hog", priority=30), headers=alice).json()["id"]
    waiting = client.post("/v1/jobs", json=mlp_spec(name="later"), headers=alice).json()["id"]
    run_dir = start_job(settings, running)
    (run_dir / "artifacts").mkdir()
    (run_dir / "artifacts" / "trace.json").write_text("{}")
    with session_of(settings) as session:
        ingest_events(session, running, [metric_event(1, 4, **{"train/loss": 0.5})])

    # What a GPU on `torchyard hosts` is held by, the admin can look at: the job, its metrics, files and logs.
    assert client.get(f"/v1/jobs/{running}").json()["owner"] == "alice"
    assert [p["value"] for p in client.get(f"/v1/jobs/{running}/metrics").json()["items"]] == [0.5]
    assert [a["path"] for a in client.get(f"/v1/jobs/{running}/artifacts").json()["items"]] == ["trace.json"]
    assert client.get(f"/v1/jobs/{running}/checkpoints").status_code == 200
    assert client.get(f"/v1/jobs/{running}/logs").status_code in (200, 404)  # no log written yet: the job's own 404

    # ... and act on it.
    assert client.patch(f"/v1/jobs/{running}", json={"priority": 95}).json()["priority"] == 95  # above alice's 50
    assert client.post(f"/v1/jobs/{running}/cancel").json()["status"] == "cancelling"
    assert client.post(f"/v1/jobs/{waiting}/cancel").json()["status"] == "cancelled"
    # alice's history says who did it.
    assert client.get(f"/v1/jobs/{running}", headers=alice).json()["transitions"][-1]["reason"] == "cancel requested by admin"
    assert client.get(f"/v1/jobs/{waiting}", headers=alice).json()["transitions"][-1]["reason"] == "cancelled by admin"
    assert client.delete(f"/v1/jobs/{waiting}").status_code == 204
    assert client.get(f"/v1/jobs/{waiting}", headers=alice).status_code == 404

    # The admin's list is its own unless it names an owner, or * for everyone's.
    mine = client.post("/v1/jobs", json=mlp_spec(name="admins")).json()["id"]
    assert [j["id"] for j in client.get("/v1/jobs").json()["items"]] == [mine]
    assert [j["id"] for j in client.get("/v1/jobs", params={"owner": "alice"}).json()["items"]] == [running]
    everyone = client.get("/v1/jobs", params={"owner": "*", "limit": 1}).json()
    following = client.get("/v1/jobs", params={"owner": "*", "cursor": everyone["next_cursor"]}).json()
    assert [(j["id"], j["owner"]) for j in everyone["items"] + following["items"]] == [(mine, "admin"), (running, "alice")]
    # A retry stays the caller's own act: the new job would be the admin's, so another owner's job is not found.
    with session_of(settings) as session:
        session.exec(sa.update(Job).where(Job.id == running).values(status="cancelled"))  # type: ignore[call-overload]
        session.commit()
    assert client.post(f"/v1/jobs/{running}/retry").status_code == 404
    # The owner's own cancel says so too.
    own = client.post("/v1/jobs", json=mlp_spec(name="alices-own"), headers=alice).json()["id"]
    client.post(f"/v1/jobs/{own}/cancel", headers=alice)
    assert client.get(f"/v1/jobs/{own}", headers=alice).json()["transitions"][-1]["reason"] == "cancelled by user"


def test_a_tenant_reaches_neither_another_owners_jobs_nor_their_list(client: TestClient) -> None:
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    hers = client.post("/v1/jobs", json=mlp_spec(), headers=alice).json()["id"]
    theirs = client.post("/v1/jobs", json=mlp_spec()).json()["id"]  # the admin's
    for job_id in (hers, theirs):
        for method, path, body in (("GET", "", None), ("GET", "/metrics", None), ("POST", "/cancel", None),
                                   ("PATCH", "", {"priority": 10}), ("DELETE", "", None)):
            assert client.request(method, f"/v1/jobs/{job_id}{path}", json=body, headers=bob).status_code == 404
    for owner in ("alice", "*", "admin"):
        refused = client.get("/v1/jobs", params={"owner": owner}, headers=bob)
        assert refused.status_code == 403 and "only the admin key" in refused.json()["detail"], refused.text
    assert client.get("/v1/jobs", params={"owner": "bob"}, headers=bob).json()["items"] == []  # its own, named
    assert client.get("/v1/jobs", params={"owner": "not a name"}).status_code == 422
    assert client.get(f"/v1/jobs/{hers}", headers=alice).json()["status"] == "queued"  # nothing happened to it
