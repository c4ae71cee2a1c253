"""A trainer that writes an event the service cannot store fails its job once, naming the line."""

from __future__ import annotations

import textwrap

import pytest

from tests.chaos.conftest import loss_steps
from tests.helpers import Services
from worker.sandbox.processes import marked_processes

pytestmark = pytest.mark.slow

BAD_WRITER = textwrap.dedent("""
    import json, time
    from torchyard import report

    report.metrics(1, {"train/loss": 1.0})
    with open(report.run_dir() / "events.jsonl", "a") as f:  # values as a list: not storable
        f.write(json.dumps({"seq": 2, "time": time.time(), "type": "metric", "step": 2, "values": [0.5]}) + "\\n")
    time.sleep(120)  # the worker stops it; it must not get to the end on its own
""")


def test_malformed_event_fails_the_job_once_as_bad_event(services: Services) -> None:
    (services.settings.code_dir / "bad_writer.py").write_text(BAD_WRITER, encoding="utf-8")
    services.start_api()
    services.start_worker()
    spec = {"kind": "script", "name": "bad-event", "entrypoint": "bad_writer.py", "parallel": {"nproc_per_node": 1},
            "retries": 2}
    with services.client() as client:
        created = client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=120)
        assert job["status"] == "failed"
        assert job["error"]["type"] == "bad_event"
        assert "events.jsonl line 2: values is not an object" in job["error"]["message"]
        assert job["attempt"] == 1  # not retried: the same code would write the same line
        assert loss_steps(client, job_id) == [1]  # what came before the bad line is stored
        assert marked_processes(job_id) == []
