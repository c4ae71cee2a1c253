"""Job detail: attempts, transitions, queue position and why a queued job waits."""

from __future__ import annotations

from fastapi.testclient import TestClient
from rq import Worker

from api.schemas import AttemptOut, JobOut, TransitionOut
from jobs import service
from jobs.models import Status
from jobs.settings import Settings
from jobs.states import transition
from tests.api.conftest import finish_job, key_headers, mlp_spec, session_of, start_job


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


def test_detail_after_each_change_shows_it_at_once(client: TestClient, settings: Settings) -> None:
    """A GET right after a transition committed by another connection sees it: no earlier answer or snapshot is served."""
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    seen = [client.get(f"/v1/jobs/{job_id}").json()["status"]]
    start_job(settings, job_id)
    seen.append(client.get(f"/v1/jobs/{job_id}").json()["status"])
    for _ in range(3):  # the same answer read again, then the change: still seen on the next GET
        client.get(f"/v1/jobs/{job_id}")
    with session_of(settings) as s:
        transition(s, job_id, Status.CANCELLING, expect=[Status.RUNNING], reason="cancel requested")
    seen.append(client.get(f"/v1/jobs/{job_id}").json()["status"])
    finish_job(settings, job_id, to=Status.CANCELLED, reason="cancelled")
    detail = client.get(f"/v1/jobs/{job_id}").json()
    seen.append(detail["status"])
    assert seen == ["queued", "running", "cancelling", "cancelled"]
    assert [t["to_status"] for t in detail["transitions"]] == ["running", "cancelling", "cancelled"]
    assert detail["attempts"][0]["outcome"] == "cancelled" and detail["attempts"][0]["finished_at"] is not None


def test_detail_attempts_and_transitions_are_the_stored_rows(client: TestClient, settings: Settings) -> None:
    """Read in one statement, they are field for field what the ORM loads, times as aware UTC with microseconds."""
    job_id = client.post("/v1/jobs", json=mlp_spec(retries=1)).json()["id"]
    start_job(settings, job_id, worker="w1")
    finish_job(settings, job_id)
    detail = client.get(f"/v1/jobs/{job_id}").json()
    with session_of(settings) as s:
        attempts = [AttemptOut.model_validate(a, from_attributes=True).model_dump(mode="json") for a in service.attempts(s, job_id)]
        transitions = [TransitionOut.model_validate(t, from_attributes=True).model_dump(mode="json")
                       for t in service.transitions(s, job_id)]
        job = service.get_job(s, "admin", job_id)
    assert detail["attempts"] == attempts and detail["transitions"] == transitions
    assert detail["updated_at"] == JobOut.of(job).model_dump(mode="json")["updated_at"]
    assert all(t["at"].endswith("Z") for t in detail["transitions"])


def test_detail_of_another_owners_job_is_not_found(client: TestClient, settings: Settings) -> None:
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    start_job(settings, job_id)  # not queued: the read that needs no Redis
    other = key_headers(client, "bob")
    assert client.get(f"/v1/jobs/{job_id}", headers=other).status_code == 404
    assert client.get("/v1/jobs/no-such-job", headers=other).json()["status"] == 404
