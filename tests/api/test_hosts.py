"""GET /v1/hosts: hosts as their workers registered them, alive by heartbeat, each GPU with the job that holds it."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from jobs.hosts import registry as hosts
from jobs.infra.clock import db_now
from jobs.settings import Settings
from jobs.store.models import Host, Job
from tests.api.conftest import ADMIN, key_headers, mlp_spec, session_of, start_job


def _register(settings: Settings, host_id: str, gpus: tuple[int, ...], cpu_slots: int = 4) -> None:
    with session_of(settings) as s:
        hosts.register(s, hosts.Inventory(id=host_id, gpus=gpus, cpu_slots=cpu_slots, queues=("default",)))


def _place(settings: Settings, job_id: str, placement: list[dict]) -> None:
    with session_of(settings) as s:
        s.exec(sa.update(Job).where(Job.id == job_id).values(placement=placement))
        s.commit()


def test_hosts_show_gpus_held_by_jobs_and_hide_other_owners_job_ids(client: TestClient, settings: Settings) -> None:
    _register(settings, "gpu-a", (0, 1, 2, 3))
    _register(settings, "gpu-b", (0, 1), cpu_slots=8)
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    mine = client.post("/v1/jobs", json=mlp_spec(), headers=alice).json()["id"]
    theirs = client.post("/v1/jobs", json=mlp_spec(), headers=bob).json()["id"]
    cpu_job = client.post("/v1/jobs", json=mlp_spec(), headers=bob).json()["id"]
    for job_id in (mine, theirs, cpu_job):
        start_job(settings, job_id, worker="gpu-a")
    _place(settings, mine, [{"node_rank": 0, "host": "gpu-a", "gpus": [1, 2], "cpu_slots": 0}])
    _place(settings, theirs, [{"node_rank": 0, "host": "gpu-a", "gpus": [3], "cpu_slots": 0},
                              {"node_rank": 1, "host": "gpu-b", "gpus": [0], "cpu_slots": 0}])
    _place(settings, cpu_job, [{"node_rank": 0, "host": "gpu-b", "gpus": [], "cpu_slots": 3}])

    seen = {h["id"]: h for h in client.get("/v1/hosts", headers=alice).json()["items"]}
    assert list(seen) == ["gpu-a", "gpu-b"]
    a = seen["gpu-a"]
    assert a["alive"] is True and a["last_seen"] is not None
    ready = {"state": "ready", "reason": None}
    assert a["gpus"] == [{"index": 0, "busy": False, "job_id": None, **ready}, {"index": 1, "busy": True, "job_id": mine, **ready},
                         {"index": 2, "busy": True, "job_id": mine, **ready}, {"index": 3, "busy": True, "job_id": None, **ready}]
    assert (a["state"], a["reason"]) == ("ready", None)
    assert a["jobs"] == [mine]
    assert seen["gpu-b"]["gpus"] == [{"index": 0, "busy": True, "job_id": None, **ready},
                                     {"index": 1, "busy": False, "job_id": None, **ready}]
    assert seen["gpu-b"]["cpu_slots"] == {"total": 8, "used": 3}

    admin = {h["id"]: h for h in client.get("/v1/hosts", headers=ADMIN).json()["items"]}
    assert [g["job_id"] for g in admin["gpu-a"]["gpus"]] == [None, mine, mine, theirs]
    assert admin["gpu-b"]["jobs"] == sorted([theirs, cpu_job])

    # A job that ends frees its GPUs at once: holdings are read from running jobs, not kept on the host.
    client.post(f"/v1/jobs/{mine}/cancel", headers=alice)
    with session_of(settings) as s:
        s.exec(sa.update(Job).where(Job.id == mine).values(status="cancelled"))
        s.commit()
    after = {h["id"]: h for h in client.get("/v1/hosts", headers=alice).json()["items"]}
    assert [g["busy"] for g in after["gpu-a"]["gpus"]] == [False, False, False, True]


def test_a_host_without_a_heartbeat_for_one_lease_is_dead_and_a_stopped_one_at_once(client: TestClient, settings: Settings) -> None:
    _register(settings, "old", (0,))
    _register(settings, "stopped", (0,))
    _register(settings, "fresh", ())
    with session_of(settings) as s:
        # One lease and a second ago, on the database's clock.
        s.exec(sa.update(Host).where(Host.id == "old").values(last_seen=db_now(s, -(settings.lease_ttl_s + 1))))
        s.commit()
        hosts.deregister(s, "stopped")
    seen = {h["id"]: h for h in client.get("/v1/hosts").json()["items"]}
    assert {k: v["alive"] for k, v in seen.items()} == {"fresh": True, "old": False, "stopped": False}
    assert seen["stopped"]["last_seen"] is None
    assert seen["fresh"]["gpus"] == [] and seen["fresh"]["cpu_slots"] == {"total": 4, "used": 0}
    with session_of(settings) as s:
        assert hosts.heartbeat(s, "old")
        assert not hosts.heartbeat(s, "never-registered")
    assert {h["id"]: h["alive"] for h in client.get("/v1/hosts").json()["items"]}["old"] is True


def test_hosts_need_a_key(client: TestClient) -> None:
    resp = client.get("/v1/hosts", headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401
