"""The jobs API against real Redis and a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from sqlmodel import Session

from jobs.reads import cursors
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.ingest import ingest_events
from tests.api.conftest import key_headers, mlp_spec


def test_submit_queues_job_in_sql(client: TestClient, settings: Settings) -> None:
    resp = client.post("/v1/jobs", json=mlp_spec(labels={"team": "vision"}))
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert job["status"] == "queued"
    assert job["owner"] == "admin"
    assert job["labels"] == {"team": "vision"}
    assert job["queue_position"] is None and job["waiting_reason"] is None  # until the scheduler's next pass
    assert job["placement"] is None
    assert job["spec"]["train"]["global_batch_size"] == 32
    # The scheduler reads queued jobs from SQL: nothing waits in Redis.
    assert Redis.from_url(settings.redis_url).keys("rq:queue:*") == []
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"train": {"global_batch_size": 33}}, "train.global_batch_size"),
        ({"model": {"name": "transformer-xxl"}}, "model.name"),
        ({"model": {"name": "mlp", "args": {"hidden": 0}}}, "model.args.hidden"),
        ({"parallel": {"nproc_per_node": 64}}, "parallel.nproc_per_node"),
        ({"data": {"name": "tensor-file", "args": {"path": "../../etc/passwd"}}}, "data.args.path"),
        ({"data": {"name": "tensor-file", "args": {"path": "/etc/passwd"}}}, "data.args.path"),
        ({"train": {"lr": -1}}, "train.lr"),
        ({"train": {"epochs": 10**9}}, "train.epochs"),
        ({"train": {"warp_speed": True}}, "train.warp_speed"),
        ({"name": "no spaces allowed"}, "name"),
        ({"model": {"name": "gpt"}}, "model.name"),
        ({"timeout_s": 0}, "timeout_s"),
        # Model parallelism: 3 stages do not divide 2 layers (nor 2 ranks); 3 heads over 2 tensor ranks; 4 ranks over 2.
        ({"parallel": {"nproc_per_node": 2, "pipeline": {"stages": 3, "microbatches": 3}}}, "parallel.pipeline.stages"),
        ({"model": {"name": "gpt", "args": {"n_head": 3, "n_embd": 48}}, "data": {"name": "synthetic-lm"},
          "parallel": {"nproc_per_node": 2, "tensor": 2}}, "parallel.tensor"),
        ({"model": {"name": "gpt", "args": {"n_head": 4}}, "data": {"name": "synthetic-lm"},
          "parallel": {"nproc_per_node": 3, "tensor": 2, "strategy": "fsdp"}}, "parallel.tensor"),
        ({"model": {"name": "gpt", "args": {"n_layer": 2}}, "data": {"name": "synthetic-lm"},
          "parallel": {"nproc_per_node": 2, "pipeline": {"stages": 2}}}, "model.args.tie_embeddings"),
    ],
)
def test_bad_spec_is_422_naming_the_field_and_creates_nothing(client: TestClient, settings: Settings, change: dict, field: str) -> None:
    resp = client.post("/v1/jobs", json=mlp_spec(**change))
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert field in [e["field"] for e in body["errors"]]
    assert field in body["detail"]
    assert client.get("/v1/jobs").json()["items"] == []


def test_auth_is_required_and_errors_are_problem_json(client: TestClient) -> None:
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
        resp = client.get("/v1/jobs", headers=headers)
        assert resp.status_code == 401
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["detail"]
    missing = client.get("/v1/jobs/nope")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "job nope not found"


def test_cancel_queued_job_never_runs_and_second_cancel_conflicts(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    resp = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelled"
    assert resp.json()["finished_at"] is not None
    again = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert "already cancelled" in again.json()["detail"]


def test_a_priority_change_that_cannot_be_made_is_refused_and_changes_nothing(client: TestClient) -> None:
    bob = key_headers(client, "bob")  # a key of max_priority 50, the default
    mine = client.post("/v1/jobs", json=mlp_spec(priority=20), headers=bob).json()["id"]
    refused = {
        "above the key's max_priority": (client.patch(f"/v1/jobs/{mine}", json={"priority": 51}, headers=bob), 422, "priority"),
        "out of range": (client.patch(f"/v1/jobs/{mine}", json={"priority": -1}, headers=bob), 422, "priority"),
        "not a number": (client.patch(f"/v1/jobs/{mine}", json={"priority": "high"}, headers=bob), 422, "priority"),
        "another field": (client.patch(f"/v1/jobs/{mine}", json={"priority": 30, "queue": "x"}, headers=bob), 422, "queue"),
        "another owner's job": (client.patch(f"/v1/jobs/{mine}", json={"priority": 30}, headers=key_headers(client, "eve")), 404, None),
    }
    for what, (resp, status, field) in refused.items():
        assert resp.status_code == status, (what, resp.text)
        if field:
            assert [e["field"] for e in resp.json()["errors"]] == [field], (what, resp.text)
    assert "max_priority 50" in refused["above the key's max_priority"][0].json()["detail"]
    assert client.get(f"/v1/jobs/{mine}", headers=bob).json()["priority"] == 20
    assert client.patch(f"/v1/jobs/{mine}", json={"priority": 40.0}, headers=bob).json()["priority"] == 40  # JSON's integer
    for not_whole in (40.5, True, "40"):
        assert client.patch(f"/v1/jobs/{mine}", json={"priority": not_whole}, headers=bob).status_code == 422, not_whole
    assert client.patch(f"/v1/jobs/{mine}", json={"priority": 50}, headers=bob).json()["priority"] == 50
    client.post(f"/v1/jobs/{mine}/cancel", headers=bob)
    finished = client.patch(f"/v1/jobs/{mine}", json={"priority": 10}, headers=bob)
    assert finished.status_code == 409 and "only a queued or running job's priority can change" in finished.json()["detail"]
    assert client.get(f"/v1/jobs/{mine}", headers=bob).json()["priority"] == 50


def test_list_is_newest_first_with_cursor_and_filters(client: TestClient) -> None:
    ids = [client.post("/v1/jobs", json=mlp_spec(name=f"job-{i}", labels={"i": str(i % 2)})).json()["id"] for i in range(5)]
    client.post(f"/v1/jobs/{ids[0]}/cancel")
    seen, cursor = [], None
    while True:
        page = client.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    assert [j["id"] for j in client.get("/v1/jobs", params={"status": "cancelled"}).json()["items"]] == [ids[0]]
    assert [j["id"] for j in client.get("/v1/jobs", params={"name": "job-3"}).json()["items"]] == [ids[3]]
    assert [j["id"] for j in client.get("/v1/jobs", params={"label": "i=1"}).json()["items"]] == [ids[3], ids[1]]
    assert client.get("/v1/jobs", params={"cursor": "@@@"}).status_code == 422


def test_metrics_and_checkpoints_read_back_what_was_ingested(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    events = [{"seq": i + 1, "time": 100.0 + i, "type": "metric", "step": (i + 1) * 10, "epoch": 0,
               "values": {"train/loss": 2.0 - i * 0.1, "train/lr": 0.01}} for i in range(5)]
    events.append({"seq": 6, "time": 106.0, "type": "checkpoint", "step": 50, "epoch": 0, "path": "checkpoints/step_00000050"})
    with Session(get_engine(settings.database_url)) as session:
        assert ingest_events(session, job["id"], events) == 6
    metrics = client.get(f"/v1/jobs/{job['id']}/metrics", params={"name": "train/loss"}).json()
    assert [(m["step"], round(m["value"], 3)) for m in metrics["items"]] == [(10, 2.0), (20, 1.9), (30, 1.8), (40, 1.7), (50, 1.6)]
    page = client.get(f"/v1/jobs/{job['id']}/metrics", params={"since_step": 30, "limit": 3}).json()
    assert [(m["step"], m["name"]) for m in page["items"]] == [(30, "train/loss"), (30, "train/lr"), (40, "train/loss")]
    rest = client.get(f"/v1/jobs/{job['id']}/metrics", params={"since_step": 30, "cursor": page["next_cursor"]}).json()
    assert [(m["step"], m["name"]) for m in rest["items"]] == [(40, "train/lr"), (50, "train/loss"), (50, "train/lr")]
    # Past the steps' 32-bit columns but within what the API takes: nothing after it, not PostgreSQL's cast error.
    for since in (cursors.SQL_INT4_MAX + 1, 2**61, cursors.SQL_INT_MAX):
        beyond = client.get(f"/v1/jobs/{job['id']}/metrics", params={"since_step": since})
        assert beyond.status_code == 200 and beyond.json()["items"] == [], beyond.text
    detail = client.get(f"/v1/jobs/{job['id']}").json()
    assert detail["last_step"] == 50
    assert detail["latest_metrics"]["train/loss"] == pytest.approx(1.6)
    ckpts = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert [c["step"] for c in ckpts] == [50]


def test_readyz_reports_both_dependencies(client: TestClient) -> None:
    body = client.get("/readyz").json()
    assert body == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}
    assert client.get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("change", "errors"),
    [
        ({"parallel": {"nproc_per_node": "two"}}, {"parallel.nproc_per_node": 'must be an integer from 1 to 64 or "gpu"; got "two"'}),
        ({"train": {"global_batch_size": 32, "learning_rate": 0.1}}, {"train.learning_rate": 'unknown field; did you mean "lr"?'}),
        ({"paralel": {"nproc_per_node": 2}}, {"paralel": 'unknown field; did you mean "parallel"?'}),
        ({"parallel": {"strategy": "dpp"}}, {"parallel.strategy": 'must be "ddp" or "fsdp"; got "dpp"; did you mean "ddp"?'}),
        ({"train": {"epochs": 1.5, "global_batch_size": 32}}, {"train.epochs": "must be an integer from 1 to 100000; got 1.5"}),
        ({"model": {"name": "mlp", "args": {"hiden": 16}}}, {"model.args.hiden": 'unknown field; did you mean "hidden"?'}),
    ],
)
def test_spec_errors_are_said_in_the_users_words_with_a_suggestion(client: TestClient, change: dict, errors: dict[str, str]) -> None:
    resp = client.post("/v1/jobs", json=mlp_spec(**change))
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert {e["field"]: e["message"] for e in body["errors"]} == errors
    assert body["detail"] == "; ".join(f"{field}: {message}" for field, message in errors.items())
    assert client.get("/v1/jobs").json()["items"] == []


def test_a_missing_script_without_uploaded_code_points_at_workdir(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json={"kind": "script", "name": "s", "entrypoint": "train.py"})
    assert resp.status_code == 422, resp.text
    [error] = resp.json()["errors"]
    assert error["field"] == "entrypoint"
    assert error["message"].startswith("'train.py': no such file under the service's code root; to run code from your own directory")
    assert "torchyard submit SPEC --workdir DIR" in error["message"]


def test_a_body_that_is_not_a_spec_mapping_is_named_as_the_body(client: TestClient) -> None:
    resp = client.post("/v1/jobs", json=[1, 2])
    assert resp.status_code == 422, resp.text
    assert resp.json()["errors"] == [{"field": "body", "message": "must be a mapping of fields; got [1, 2]"}]
