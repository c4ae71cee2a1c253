"""Job detail: attempts, transitions, queue position and why a queued job waits."""

from __future__ import annotations

from fastapi.testclient import TestClient
from redis import Redis

from api.schemas import AttemptOut, JobOut, TransitionOut
from jobs.hosts import registry as hosts
from jobs.reads import job_lookup
from jobs.scheduling import leader
from jobs.scheduling.scheduler import run_pass
from jobs.settings import Settings
from jobs.store.models import Status
from jobs.store.states import transition
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


def _host(settings: Settings, host_id: str, cpu_slots: int, gpus: int = 0) -> None:
    with session_of(settings) as s:
        hosts.register(s, hosts.Inventory(id=host_id, gpus=tuple(range(gpus)), cpu_slots=cpu_slots, queues=("default",)))


def _scheduler_pass(settings: Settings) -> list[str]:
    """One pass of the scheduler as its leader runs it; the ids it placed."""
    with session_of(settings) as s:
        assert leader.hold(s, leader.SCHEDULER, "test", settings.lease_ttl_s)
        return run_pass(s, Redis.from_url(settings.redis_url), settings, "test").placed


def test_waiting_reason_names_the_cause(client: TestClient, settings: Settings) -> None:
    settings.queues = ["default", "gpu-big"]  # TORCHYARD_QUEUES: a job for any other queue is refused
    first = client.post("/v1/jobs", json=mlp_spec()).json()
    # Until the scheduler's next pass there is nothing to say: no reason that reads like a fault.
    assert first["queue_position"] is None and first["waiting_reason"] is None
    other = client.post("/v1/jobs", json=mlp_spec(queue="gpu-big")).json()
    _scheduler_pass(settings)
    assert client.get(f"/v1/jobs/{first['id']}").json()["waiting_reason"] == "no live host serves queue default"
    assert client.get(f"/v1/jobs/{other['id']}").json()["waiting_reason"] == "no live host serves queue gpu-big"


def test_waiting_reason_with_a_host(client: TestClient, settings: Settings) -> None:
    _host(settings, "cpu-a", cpu_slots=2)
    ids = [client.post("/v1/jobs", json=mlp_spec()).json()["id"] for _ in range(4)]  # 2 ranks each, on CPU
    assert _scheduler_pass(settings) == ids[:1]
    details = [client.get(f"/v1/jobs/{i}").json() for i in ids]
    assert details[0]["status"] == "running" and details[0]["waiting_reason"] is None
    assert details[0]["placement"] == [{"node_rank": 0, "host": "cpu-a", "gpus": [], "cpu_slots": 2}]
    assert [d["queue_position"] for d in details[1:]] == [0, 1, 2]
    # They fitted the idle host when the pass began; the job placed ahead of them took it.
    assert [d["waiting_reason"] for d in details[1:]] == ["1 job ahead of it"] * 3
    _scheduler_pass(settings)
    assert [client.get(f"/v1/jobs/{i}").json()["waiting_reason"] for i in ids[1:]] == [
        "needs 2 CPU slots on one host; all CPU slots are busy"] * 3
    big = client.post("/v1/jobs", json=mlp_spec(parallel={"strategy": "ddp", "nproc_per_node": 4})).json()["id"]
    _scheduler_pass(settings)
    assert client.get(f"/v1/jobs/{big}").json()["waiting_reason"] == "needs 4 CPU slots on one host; no host has 4 (largest: cpu-a with 2)"


def test_waiting_reason_running_cap(client: TestClient, settings: Settings) -> None:
    capped = settings.model_copy(update={"max_running_per_owner": 1})
    _host(settings, "cpu-a", cpu_slots=8)
    running = client.post("/v1/jobs", json=mlp_spec()).json()
    start_job(settings, running["id"])
    waiting = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    assert _scheduler_pass(capped) == []
    assert client.get(f"/v1/jobs/{waiting}").json()["waiting_reason"] == "over the owner's running-job cap: 1 running, the cap is 1"


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
        attempts = [AttemptOut.model_validate(a, from_attributes=True).model_dump(mode="json") for a in job_lookup.attempts(s, job_id)]
        transitions = [TransitionOut.model_validate(t, from_attributes=True).model_dump(mode="json")
                       for t in job_lookup.transitions(s, job_id)]
        job = job_lookup.get_job(s, "admin", job_id)
    assert detail["attempts"] == attempts and detail["transitions"] == transitions
    assert detail["updated_at"] == JobOut.of(job).model_dump(mode="json")["updated_at"]
    assert all(t["at"].endswith("Z") for t in detail["transitions"])


def test_detail_of_another_owners_job_is_not_found(client: TestClient, settings: Settings) -> None:
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    start_job(settings, job_id)  # not queued: the read that needs no Redis
    other = key_headers(client, "bob")
    assert client.get(f"/v1/jobs/{job_id}", headers=other).status_code == 404
    assert client.get("/v1/jobs/no-such-job", headers=other).json()["status"] == 404


def test_queue_lists_waiting_jobs_in_the_schedulers_order_with_reasons(client: TestClient, settings: Settings) -> None:
    _host(settings, "cpu-a", cpu_slots=2)
    alice = key_headers(client, "alice")
    ids = [client.post("/v1/jobs", json=mlp_spec(), headers=alice).json()["id"] for _ in range(3)]
    theirs = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    before = client.get("/v1/queue", headers=alice).json()["items"]
    assert [q["id"] for q in before] == ids and all(q["waiting_reason"] is None for q in before)
    _scheduler_pass(settings)
    _scheduler_pass(settings)
    mine = client.get("/v1/queue", headers=alice).json()["items"]
    assert [q["id"] for q in mine] == ids[1:]  # the first runs; another owner's job is not listed
    # Fair share: the admin's job goes first, alice already runs one.
    assert [q["queue_position"] for q in mine] == [1, 2]
    assert mine[0]["waiting_reason"] == "needs 2 CPU slots on one host; all CPU slots are busy"
    assert (mine[0]["nnodes"], mine[0]["nproc_per_node"], mine[0]["device"]) == (1, 2, "auto")
    everyone = client.get("/v1/queue").json()["items"]
    assert [q["id"] for q in everyone] == [theirs, *ids[1:]] and everyone[0]["queue_position"] == 0
