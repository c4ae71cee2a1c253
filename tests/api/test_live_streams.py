"""Streams over real HTTP from `python -m api`: events and followed logs arrive while the job runs."""

from __future__ import annotations

import time

from jobs.settings import Settings
from tests.api.conftest import finish_job, ingest, metric_event, mlp_spec, start_job
from tests.api.test_events import parse_sse
from tests.helpers import Services


def test_events_and_logs_stream_live_from_the_real_server(services: Services, settings: Settings) -> None:
    services.start_api()
    with services.client() as client:
        job = client.post("/v1/jobs", json=mlp_spec()).json()
        run_dir = start_job(settings, job["id"])
        log = run_dir / "logs" / "attempt-1" / "launcher.log"
        log.parent.mkdir(parents=True)
        log.write_text("first line\n")

        with client.stream("GET", f"/v1/jobs/{job['id']}/events") as events, \
                client.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"rank": "launcher", "follow": "true"}) as logs:
            assert events.status_code == 200 and logs.status_code == 200
            sse_lines, log_chunks = events.iter_lines(), logs.iter_bytes()
            # Both answer while the job is still running: they stream, they do not wait for the end.
            first = _next_event(sse_lines)
            assert first[1] == "status" and first[2]["status"] == "running"
            assert next(log_chunks) == b"first line\n"

            ingest(settings, job["id"], [metric_event(1, 10)])
            metric = _next_event(sse_lines)
            assert metric[1] == "metric" and metric[2]["step"] == 10
            with log.open("a") as f:
                f.write("second line\n")
            assert next(log_chunks) == b"second line\n"

            finish_job(settings, job["id"])
            rest = []
            deadline = time.monotonic() + 30
            while not rest or rest[-1][1] != "end":
                rest.append(_next_event(sse_lines))
                assert time.monotonic() < deadline
            assert [m[1] for m in rest] == ["status", "end"] and rest[-1][2] == {"status": "succeeded"}
            assert list(log_chunks) == []  # the followed log closes once the job is terminal

        # Reconnecting with the last id resumes after it: only the end again.
        resumed = client.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": rest[-2][0]})
        assert [m[1] for m in parse_sse(resumed.text)] == ["end"]


def _next_event(lines: object) -> tuple[str, str, dict]:
    block: list[str] = []
    for line in lines:  # type: ignore[attr-defined]
        if line == "" and any(x.startswith("event:") for x in block):
            return parse_sse("\n".join(block))[0]
        if line != "":
            block.append(line)
    raise AssertionError("stream closed early")


