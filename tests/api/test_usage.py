"""GET /v1/usage and the usage counters of /metrics, over attempts written as the scheduler and a supervisor write
them: GPU-hours are each attempt's placement times its time held, cut at the window; a tenant sees its own."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from fastapi.testclient import TestClient

from jobs.settings import Settings
from jobs.store.models import Attempt
from tests.api.conftest import ADMIN, key_headers, mlp_spec, session_of, start_job

DAY = datetime(2026, 10, 5, tzinfo=timezone.utc)


def _attempt(settings: Settings, job_id: str, gpus: list[int], start: datetime, end: datetime | None, outcome: str | None,
             cpu_slots: int = 0) -> None:
    with session_of(settings) as s:
        s.exec(sa.update(Attempt).where(Attempt.job_id == job_id).values(
            started_at=start, finished_at=end, outcome=outcome,
            placement=[{"node_rank": 0, "host": "gpu-a", "gpus": gpus, "cpu_slots": cpu_slots}]))
        s.commit()


def _job(client: TestClient, settings: Settings, headers: dict[str, str]) -> str:
    job_id = client.post("/v1/jobs", json=mlp_spec(), headers=headers).json()["id"]
    start_job(settings, job_id)
    return job_id


def test_usage_per_owner_and_day_from_the_attempts_a_tenant_sees_its_own(client: TestClient, settings: Settings) -> None:
    alice, bob = key_headers(client, "alice"), key_headers(client, "bob")
    # alice: 2 GPUs from 22:00 to 02:00 across midnight, preempted; bob: 1 GPU for 3 hours, plus 4 CPU slots.
    a = _job(client, settings, alice)
    _attempt(settings, a, [0, 1], DAY + timedelta(hours=22), DAY + timedelta(hours=26), "preempted")
    b = _job(client, settings, bob)
    _attempt(settings, b, [2], DAY + timedelta(hours=1), DAY + timedelta(hours=4), "succeeded", cpu_slots=4)

    everyone = client.get("/v1/usage", headers=ADMIN)
    assert everyone.status_code == 200, everyone.text
    rows = {r["owner"]: r for r in everyone.json()["items"]}
    assert rows["alice"] == {"owner": "alice", "gpu_hours": 8.0, "cpu_slot_hours": 0.0, "jobs": 1, "attempts": 1,
                             "preempted_gpu_hours": 8.0}
    assert rows["bob"]["gpu_hours"] == 3.0 and rows["bob"]["cpu_slot_hours"] == 12.0 and rows["bob"]["preempted_gpu_hours"] == 0
    assert everyone.json()["from"] is None and everyone.json()["to"]

    mine = client.get("/v1/usage", params={"group_by": "owner,day"}, headers=alice).json()["items"]
    each_day = {"gpu_hours": 4.0, "cpu_slot_hours": 0.0, "jobs": 1, "attempts": 1, "preempted_gpu_hours": 4.0}
    assert mine == [{"owner": "alice", "day": "2026-10-05", **each_day}, {"owner": "alice", "day": "2026-10-06", **each_day}]
    # A window cuts the attempts at its edges: from 23:00 to 03:00 alice held 2 GPUs for 3 h, bob 1 GPU for 2 h.
    cut = client.get("/v1/usage", params={"from": (DAY + timedelta(hours=1, minutes=30)).isoformat(),
                                          "to": (DAY + timedelta(hours=25)).isoformat()}, headers=ADMIN).json()
    assert {r["owner"]: r["gpu_hours"] for r in cut["items"]} == {"alice": 6.0, "bob": 2.5}
    by_day = client.get("/v1/usage", params={"group_by": "day"}, headers=ADMIN).json()["items"]
    assert [(r["day"], r["gpu_hours"]) for r in by_day] == [("2026-10-05", 7.0), ("2026-10-06", 4.0)] and "owner" not in by_day[0]

    text = client.get("/v1/usage", params={"group_by": "owner,day"}, headers={**ADMIN, "Accept": "text/csv"})
    assert text.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(text.text)))
    assert [(r["owner"], r["day"], float(r["gpu_hours"])) for r in table] == [
        ("alice", "2026-10-05", 4.0), ("alice", "2026-10-06", 4.0), ("bob", "2026-10-05", 3.0)]

    metrics = client.get("/metrics").text
    assert 'torchyard_gpu_seconds_total{owner="alice"} 28800.0' in metrics
    assert 'torchyard_cpu_slot_seconds_total{owner="bob"} 43200.0' in metrics


def test_a_running_attempt_counts_until_now(client: TestClient, settings: Settings) -> None:
    job_id = _job(client, settings, ADMIN)
    _attempt(settings, job_id, [0, 1, 2, 3], datetime.now(timezone.utc) - timedelta(hours=1), None, None)
    [row] = client.get("/v1/usage").json()["items"]
    assert 4.0 <= row["gpu_hours"] < 4.1 and row["attempts"] == 1


def test_bad_windows_and_groupings_are_422_naming_the_field(client: TestClient) -> None:
    for params, field in (({"group_by": "host"}, "group_by"), ({"from": "yesterday"}, "from"), ({"to": "1700000000"}, "to")):
        resp = client.get("/v1/usage", params=params)
        assert resp.status_code == 422, resp.text
        assert resp.json()["errors"][0]["field"] == field, resp.text
    # A window that ends before it starts holds nothing.
    empty = client.get("/v1/usage", params={"from": "2026-11-02T00:00:00Z", "to": "2026-11-01T00:00:00Z"})
    assert empty.status_code == 200 and empty.json()["items"] == []
