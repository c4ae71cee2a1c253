"""/v1/sweeps without processes: what a bad sweep answers, owner scoping (the admin reaches every owner's), trials
created as labelled jobs, cancel."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from jobs.settings import Settings
from jobs.sweeps import controller
from tests.api.conftest import key_headers, mlp_spec, session_of


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def grid_sweep(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "lr-grid", "spec": mlp_spec(parallel={"nproc_per_node": 1}), "method": "grid",
                            "metric": "eval/loss", "max_concurrent_trials": 2,
                            "space": {"train.lr": {"type": "choice", "values": [0.1, 0.01]},
                                      "model.args.hidden": {"type": "int", "low": 8, "high": 16, "step": 8}}}
    body.update(overrides)
    return body


def controller_pass(settings: Settings) -> None:
    with session_of(settings) as session:
        controller.run_pass(session, Redis.from_url(settings.redis_url), settings)


@pytest.mark.parametrize(("change", "field"), [
    ({"method": "bayes"}, "method"),
    ({"space": {"train.lr": {"type": "uniform", "low": 1.0, "high": 0.5}}}, "space.train.lr"),
    ({"space": {"train.lr": {"type": "uniform", "low": 0.1, "high": 0.5}}}, "space.train.lr"),  # continuous in a grid
    ({"space": {"train.lr": {"type": "choice", "values": [0.1, 99.0]}}}, "space.train.lr"),  # lr above 10
    ({"space": {"model.args.hidden": {"type": "int", "low": 0, "high": 4}}}, "space.model.args.hidden"),
    ({"space": {"queue": {"type": "choice", "values": ["gpu"]}}}, "space.queue"),
    ({"space": {"args.--lr": {"type": "choice", "values": [1]}}}, "space.args.--lr"),  # args of a catalog job
    ({"metric": ""}, "metric"),
    ({"method": "asha", "max_trials": 3}, "asha"),
    ({"method": "asha", "max_trials": 3, "asha": {"min_resource": 10, "rungs": 2, "brackets": 3}}, "asha.brackets"),
    ({"method": "asha", "max_trials": 3, "asha": {"min_resource": 10, "brackets": 0}}, "asha.brackets"),
    ({"method": "random"}, "max_trials"),
    ({"max_concurrent_trials": 0}, "max_concurrent_trials"),
    ({"spec": mlp_spec(train={"global_batch_size": 0})}, "spec.train.global_batch_size"),
    ({"spec": mlp_spec(priority=90)}, "spec.priority"),  # above what the key may ask
])
def test_a_bad_sweep_is_refused_naming_the_field_and_makes_nothing(client: TestClient, settings: Settings,
                                                                   change: dict[str, Any], field: str) -> None:
    tenant = key_headers(client, "alice")
    resp = client.post("/v1/sweeps", json=grid_sweep(**change), headers=tenant)
    assert resp.status_code == 422, resp.text
    fields = [e["field"] for e in resp.json()["errors"]]
    assert any(field in f for f in fields), fields
    assert client.get("/v1/sweeps", headers=tenant).json()["items"] == []
    controller_pass(settings)
    assert client.get("/v1/jobs", headers=tenant).json()["items"] == []


def test_trials_are_labelled_jobs_up_to_the_concurrency_and_cancel_stops_them(client: TestClient, settings: Settings) -> None:
    sweep = client.post("/v1/sweeps", json=grid_sweep())
    assert sweep.status_code == 201, sweep.text
    sweep_id = sweep.json()["id"]
    assert sweep.json()["max_trials"] == 4 and sweep.json()["status"] == "running"
    controller_pass(settings)
    controller_pass(settings)  # a second pass (or a second leader) creates nothing more: two slots are taken
    jobs = client.get("/v1/jobs", params={"label": f"torchyard/sweep={sweep_id}"}).json()["items"]
    assert len(jobs) == 2
    detail = client.get(f"/v1/sweeps/{sweep_id}").json()
    assert [t["params"] for t in detail["trials"]] == [{"train.lr": 0.1, "model.args.hidden": 8},
                                                       {"train.lr": 0.1, "model.args.hidden": 16}]
    by_id = {j["id"]: j for j in jobs}
    for trial in detail["trials"]:
        job = client.get(f"/v1/jobs/{trial['job_id']}").json()
        assert trial["job_id"] in by_id and trial["state"] == "running" and trial["job_status"] == "queued"
        assert job["labels"] == {"torchyard/sweep": sweep_id, "torchyard/trial": str(trial["number"])}
        assert job["spec"]["train"]["lr"] == trial["params"]["train.lr"]
        assert job["spec"]["model"]["args"]["hidden"] == trial["params"]["model.args.hidden"]

    cancelled = client.post(f"/v1/sweeps/{sweep_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert {j["status"] for j in client.get("/v1/jobs").json()["items"]} == {"cancelled"}
    controller_pass(settings)  # a cancelled sweep makes no further trials
    assert len(client.get("/v1/jobs").json()["items"]) == 2
    assert client.post(f"/v1/sweeps/{sweep_id}/cancel").status_code == 409


def test_another_owners_sweep_is_404(client: TestClient, settings: Settings) -> None:
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    sweep_id = client.post("/v1/sweeps", json=grid_sweep(), headers=alice).json()["id"]
    assert client.get(f"/v1/sweeps/{sweep_id}", headers=bob).status_code == 404
    assert client.post(f"/v1/sweeps/{sweep_id}/cancel", headers=bob).status_code == 404
    assert client.get("/v1/sweeps", headers=bob).json()["items"] == []
    assert [s["id"] for s in client.get("/v1/sweeps", headers=alice).json()["items"]] == [sweep_id]
    controller_pass(settings)
    assert {j["owner"] for j in client.get("/v1/jobs", headers=alice).json()["items"]} == {"alice"}
    assert client.get("/v1/jobs", headers=bob).json()["items"] == []


def test_the_admin_stops_a_tenants_sweep_and_its_trials(client: TestClient, settings: Settings) -> None:
    alice = key_headers(client, "alice")
    sweep_id = client.post("/v1/sweeps", json=grid_sweep(), headers=alice).json()["id"]
    controller_pass(settings)
    assert client.get(f"/v1/sweeps/{sweep_id}").json()["owner"] == "alice"
    stopped = client.post(f"/v1/sweeps/{sweep_id}/cancel")
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled", stopped.text
    controller_pass(settings)  # no trial after the cancel
    seen = client.get(f"/v1/sweeps/{sweep_id}", headers=alice).json()
    assert seen["status"] == "cancelled" and seen["message"] == "cancelled by admin", seen
    trials = client.get("/v1/jobs", params={"label": f"torchyard/sweep={sweep_id}"}, headers=alice).json()["items"]
    assert len(trials) == 2
    for job in trials:
        assert job["status"] == "cancelled"
        detail = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
        assert detail["transitions"][-1]["reason"] == "cancelled by admin"


def test_a_repeated_creation_with_one_idempotency_key_makes_one_sweep(client: TestClient) -> None:
    first = client.post("/v1/sweeps", json=grid_sweep(), headers={"Idempotency-Key": "k1"})
    again = client.post("/v1/sweeps", json=grid_sweep(), headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/sweeps", json=grid_sweep(name="other"), headers={"Idempotency-Key": "k1"})
    assert other.status_code == 422 and "Idempotency-Key" in other.json()["detail"]
    assert len(client.get("/v1/sweeps").json()["items"]) == 1
