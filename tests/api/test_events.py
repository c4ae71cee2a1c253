"""GET /v1/jobs/{id}/events: Server-Sent Events, resumable with Last-Event-ID, ending when the job ends."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jobs.reads import feed
from jobs.reads.feed import BATCH
from jobs.settings import Settings
from jobs.store.models import Status
from tests.api.conftest import finish_job, ingest, mlp_spec, start_job
from tests.helpers import told_when_called

Message = tuple[str, str, dict[str, Any]]  # (id, event, data)


def parse_sse(text: str) -> list[Message]:
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                key, _, value = line.partition(":")
                fields[key] = fields.get(key, "") + value.removeprefix(" ")
        if "event" in fields:
            out.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return out


def events(client: TestClient, job_id: str, last_event_id: str | None = None) -> list[Message]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    resp = client.get(f"/v1/jobs/{job_id}/events", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    return parse_sse(resp.text)


def _run_finished_job(client: TestClient, settings: Settings) -> dict[str, Any]:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    run_dir = start_job(settings, job["id"])
    now = time.time()
    ingest(settings, job["id"], [
        {"seq": 1, "time": now, "type": "status", "phase": "training"},
        {"seq": 2, "time": now + 1, "type": "metric", "step": 10, "epoch": 0, "values": {"train/loss": 2.0, "train/lr": 0.01}},
        {"seq": 3, "time": now + 2, "type": "metric", "step": 20, "epoch": 0, "values": {"train/loss": 1.5, "train/lr": 0.01}},
        {"seq": 4, "time": now + 3, "type": "checkpoint", "step": 20, "epoch": 0, "path": "checkpoints/step_00000020",
         "weights": "checkpoints/step_00000020/model.safetensors"},
        {"seq": 5, "time": now + 4, "type": "metric", "step": 20, "epoch": 0, "values": {"eval/loss": 1.6}},
    ])
    finish_job(settings, job["id"])
    return {**job, "run_dir": str(run_dir)}


def test_stream_of_a_finished_job(client: TestClient, settings: Settings) -> None:
    job = _run_finished_job(client, settings)
    msgs = events(client, job["id"])
    assert [m[1] for m in msgs] == ["status", "metric", "metric", "checkpoint", "metric", "end"]
    snapshot = msgs[0][2]
    assert snapshot["status"] == "succeeded" and snapshot["attempt"] == 1 and snapshot["reason"] == "torchrun exited 0"
    assert set(snapshot) == {"status", "reason", "at", "attempt"}
    metric = msgs[1][2]
    assert metric["step"] == 10 and metric["epoch"] == 0 and metric["values"] == {"train/loss": 2.0, "train/lr": 0.01}
    assert isinstance(metric["time"], float)
    assert msgs[4][2]["values"] == {"eval/loss": 1.6}
    ckpt = msgs[3][2]
    assert ckpt["step"] == 20 and ckpt["path"] == f"{job['run_dir']}/checkpoints/step_00000020"
    assert ckpt["details"] == {"weights": "checkpoints/step_00000020/model.safetensors"} and ckpt["created_at"]
    assert msgs[-1][2] == {"status": "succeeded"}
    assert len({m[0] for m in msgs[:-1]}) == len(msgs) - 1  # every message but end moves the cursor


def test_resume_after_any_message_sends_exactly_the_rest(client: TestClient, settings: Settings) -> None:
    job = _run_finished_job(client, settings)
    full = events(client, job["id"], last_event_id="0-0")  # from the very beginning: the whole history
    assert [(m[1], m[2].get("status")) for m in full if m[1] == "status"] == [("status", "running"), ("status", "succeeded")]
    assert full[0][1] == "status" and full[-1][1] == "end"
    for k in range(len(full) - 1):
        assert events(client, job["id"], last_event_id=full[k][0]) == full[k + 1:], k
    # Resuming after the end: nothing new, just the end again.
    assert [m[1] for m in events(client, job["id"], last_event_id=full[-1][0])] == ["end"]


def test_live_stream_follows_the_job_until_it_ends(client: TestClient, settings: Settings,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    client.app.state.settings = settings.model_copy(update={"sse_poll_interval_s": 0.05})  # type: ignore[attr-defined]
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    first_read = told_when_called(monkeypatch, feed, "snapshot")

    def worker() -> None:
        # The job starts once the stream's first read has seen it queued, however long a loaded machine takes to get there.
        assert first_read.wait(600), "the stream never read the job"
        start_job(settings, job["id"])
        for seq in range(1, 4):
            time.sleep(0.1)
            ingest(settings, job["id"], [{"seq": seq, "time": time.time(), "type": "metric", "step": seq * 10, "epoch": 0,
                                          "values": {"train/loss": 1.0 / seq}}])
        time.sleep(0.1)
        finish_job(settings, job["id"], Status.FAILED, reason="rank 1 ran out of memory")

    thread = threading.Thread(target=worker)
    thread.start()
    msgs = events(client, job["id"])
    thread.join()
    assert [(m[1], m[2].get("status") or m[2].get("step")) for m in msgs] == [
        ("status", "queued"), ("status", "running"), ("metric", 10), ("metric", 20), ("metric", 30),
        ("status", "failed"), ("end", "failed")]
    assert msgs[0][2]["reason"] == "submitted"
    assert msgs[5][2]["reason"] == "rank 1 ran out of memory"


def test_long_backlog_is_sent_in_order(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    start_job(settings, job["id"])
    n = BATCH * 2 + 7
    ingest(settings, job["id"], [{"seq": i, "time": 1.0 + i, "type": "metric", "step": i, "epoch": 0, "values": {"x": float(i)}}
                                 for i in range(1, n + 1)])
    finish_job(settings, job["id"])
    msgs = events(client, job["id"])
    steps = [m[2]["step"] for m in msgs if m[1] == "metric"]
    assert steps == list(range(1, n + 1))
    assert msgs[-1][1] == "end"


def test_malformed_last_event_id_is_422(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    for bad in ("nope", "1-", "-1-2", "1-2-3-4", "01-2"):
        resp = client.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": bad})
        assert resp.status_code == 422, bad
        assert resp.headers["content-type"].startswith("application/problem+json")
