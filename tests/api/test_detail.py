"""Job detail: attempts, transitions, queue position and why a queued job waits."""

from __future__ import annotations

from fastapi.testclient import TestClient
from rq import Worker

from jobs.models import Status
from jobs.settings import Settings
from jobs.states import transition
from tests.api.conftest import finish_job, mlp_spec, session_of, start_job


def test_detail_shows_attempts_and_transitions(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec(retries=1)).json()
    assert job["attempts"] == [] and job["transitions"] == []
    start_job(settings, job["id"], worker="w1")
    # The first attempt fails and the job is retried, as the supervisor does.
    with session_of(settings) as s:
        transition(s, job["id"], Status.QUEUED, expect=[Status.RUNNING], reason="attempt 1 failed (training_error); retrying",
                   values={"attempt": 2})
    start_job(settings, job["id"], worker="w2")
    finish_job(settings, job["id"])
    detail = client.get(f"/v1/jobs/{job['id']}").json()
    assert detail["status"] == "succeeded" and detail["attempt"] == 2
    assert [(a["attempt"], a["worker_id"]) for a in detail["attempts"]] == [(1, "w1"), (2, "w2")]
    assert detail["attempts"][1]["outcome"] == "succeeded"
    assert [(t["from_status"], t["to_status"], t["attempt"]) for t in detail["transitions"]] == [
        ("queued", "running", 1), ("running", "queued", 2), ("queued", "running", 2), ("running", "succeeded", 2)]
    assert detail["transitions"][1]["reason"].startswith("attempt 1 failed")
    assert detail["queue_position"] is None and detail["waiting_reason"] is None
    # The list stays light: no attempts or transitions per item.
    assert client.get("/v1/jobs").json()["items"][0]["transitions"] == []


def test_waiting_reason_names_the_cause(client: TestClient, settings: Settings) -> None:
    settings.queues = ["default", "gpu-big"]  # TORCHYARD_QUEUES: a job for any other queue is refused
    first = client.post("/v1/jobs", json=mlp_spec()).json()
    assert first["queue_position"] == 0
    assert first["waiting_reason"] == "no worker is serving queue default"
    other = client.post("/v1/jobs", json=mlp_spec(queue="gpu-big")).json()
    assert other["waiting_reason"] == "no worker is serving queue gpu-big"


def test_waiting_reason_with_a_worker(client: TestClient, settings: Settings, rq_worker: Worker) -> None:
    ids = [client.post("/v1/jobs", json=mlp_spec()).json()["id"] for _ in range(4)]
    details = [client.get(f"/v1/jobs/{i}").json() for i in ids]
    assert [d["queue_position"] for d in details] == [0, 1, 2, 3]
    assert details[3]["waiting_reason"] == "3 jobs ahead in queue default"
    assert details[1]["waiting_reason"] == "1 job ahead in queue default"
    assert "next in queue default" in details[0]["waiting_reason"]
    rq_worker.set_state("busy")
    assert "busy" in client.get(f"/v1/jobs/{ids[0]}").json()["waiting_reason"]


def test_waiting_reason_running_cap(client: TestClient, settings: Settings, rq_worker: Worker) -> None:
    capped = settings.model_copy(update={"max_running_per_owner": 1})
    client.app.state.settings = capped  # type: ignore[attr-defined]
    running = client.post("/v1/jobs", json=mlp_spec()).json()
    start_job(settings, running["id"])
    waiting = client.get(f"/v1/jobs/{client.post('/v1/jobs', json=mlp_spec()).json()['id']}").json()
    assert waiting["waiting_reason"] == "over the owner's running-job cap: 1 running, the cap is 1"
