"""Webhooks on a live service: a real job through the API and a worker, a receiver on loopback that fails its first
tries, an API restart while the job ends, and every event received once with a valid signature."""

from __future__ import annotations

import json
import logging
import signal
import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from sqlmodel import Session

from jobs.store.db import get_engine
from jobs.store.models import Job
from tests.cli.conftest import cli
from tests.helpers import Services, wait_until
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)
SECRET = "live-test-signing-secret-0123456789"


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first={"/flaky": 3})
    yield r
    r.close()


def _status(services: Services, job_id: str) -> str | None:
    with Session(get_engine(services.settings.database_url)) as session:
        job = session.get(Job, job_id)
        return job.status if job else None


def _latency_s(received_at: float, job: dict, to: str) -> float:
    at = next(t["at"] for t in job["transitions"] if t["to_status"] == to)
    return received_at - datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def test_every_event_arrives_once_signed_across_retries_and_an_api_restart(services: Services, receiver: Receiver,
                                                                           tmp_path: Path) -> None:
    env = {"TORCHYARD_SECRETS_KEY": Fernet.generate_key().decode(), "TORCHYARD_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
           "TORCHYARD_WEBHOOK_POLL_INTERVAL_S": "0.2"}
    services.start_api(**env)
    services.start_worker()
    release = tmp_path / "release"
    (services.settings.code_dir / "wait.py").write_text(textwrap.dedent(f"""
        import pathlib, time
        deadline = time.time() + 120
        while not pathlib.Path({str(release)!r}).exists() and time.time() < deadline:
            time.sleep(0.1)
    """))
    code, out = cli(services, "webhooks", "create", receiver.url("/flaky"), "--events", "job.started,job.succeeded",
                    "--secret", SECRET, "--json")
    assert code == 0, out
    flaky = json.loads(out)
    code, out = cli(services, "webhooks", "create", receiver.url("/ok"), "--events", "job.started",
                    "--events", "job.succeeded", "--secret", SECRET, "--json")
    assert code == 0, out
    with services.client() as client:
        job_id = client.post("/v1/jobs", json={"kind": "script", "name": "hooked", "entrypoint": "wait.py",
                                               "parallel": {"device": "cpu"}}).json()["id"]
        services.wait_status(client, job_id, {"running"}, timeout_s=120)
        wait_until(lambda: len(receiver.accepted("/flaky")) == 1, 120, what="job.started past the receiver's failures")
        # The job ends while the API (and its sender) is down: the event waits in the outbox.
        assert services.api is not None
        services.api.send_signal(signal.SIGTERM)
        services.api.wait(60)
        release.touch()
        wait_until(lambda: _status(services, job_id) == "succeeded", 120, what="the job to succeed while the API is down")
        services.start_api(**env)
        wait_until(lambda: len(receiver.accepted("/flaky")) == 2 and len(receiver.accepted("/ok")) == 2, 120,
                   what="job.succeeded after the restart")
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "succeeded"

        for path in ("/flaky", "/ok"):
            got = receiver.accepted(path)
            assert sorted(r.json["type"] for r in got.values()) == ["job.started", "job.succeeded"]
            assert all(r.signed_by(SECRET) and r.json["job"]["id"] == job_id for r in got.values())
            assert all(r.headers["x-torchyard-delivery"] == r.json["id"] for r in got.values())
        flaky_tries = [r for r in receiver.got if r.path == "/flaky"]
        assert [r.answered for r in flaky_tries][:4] == [500, 500, 500, 200]
        assert len({r.headers["x-torchyard-delivery"] for r in flaky_tries[:4]}) == 1  # one delivery, tried four times

        def delivered() -> list | None:  # the receiver answers before the sender writes the result down
            code, out = cli(services, "webhooks", "deliveries", flaky["id"], "--json")
            assert code == 0, out
            rows = json.loads(out)
            return rows if all(d["status"] == "delivered" for d in rows) else None

        rows = wait_until(delivered, 60, what="both deliveries recorded")
        assert sorted(d["event"] for d in rows) == ["job.started", "job.succeeded"]
        assert sorted(d["tries"] for d in rows) == [1, 4]
        code, out = cli(services, "webhooks", "ls")
        assert code == 0 and flaky["id"] in out, out

        started = next(r for r in receiver.accepted("/ok").values() if r.json["type"] == "job.started")
        log.warning("webhook latency, status change to receipt (job.started, healthy receiver): %.3f s",
                    _latency_s(started.at, job, "running"))

        code, out = cli(services, "webhooks", "rm", flaky["id"])
        assert code == 0, out
        assert [h["id"] for h in client.get("/v1/webhooks").json()["items"]] != [flaky["id"]]
