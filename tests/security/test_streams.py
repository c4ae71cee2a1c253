"""Live streams held by a tenant: a revoked key's open streams end, each owner holds a bounded number of
them, event streams end at their lifetime and clients resume with Last-Event-ID, and a followed log whose
file is swapped for a symlink to /proc/self/environ serves none of it.

One real script job (``sleeper.py``, one rank printing a line every 0.2 s) runs through the module; the
lifetime test, last, ends it with a cancel."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import wait_until
from tests.security.conftest import Live
from torchyard.client import Client
from torchyard.client.models import EndEvent, StatusEvent

pytestmark = pytest.mark.slow

# A stream that does not end within this long failed to end: nothing here waits for it on purpose.
READ_TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture(scope="module")
def sleeper(live: Live) -> Iterator[dict[str, Any]]:
    """The running job, owned by "carol" and submitted with her first key."""
    key_id, key = live.new_key("carol")
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as carol:
        job = carol.post("/v1/jobs", json={"kind": "script", "name": "sleeper", "entrypoint": "sleeper.py"}).json()

        def rank_log() -> Path | None:
            detail = carol.get(f"/v1/jobs/{job['id']}").json()
            if detail["status"] != "running" or not detail["run_dir"]:
                return None
            found = list(Path(detail["run_dir"]).glob("logs/attempt-1/*/attempt_0/0/stdout.log"))
            return found[0] if found and found[0].stat().st_size else None

        log_path = wait_until(rank_log, 120, what="the sleeper's rank 0 to print")
        try:
            yield {"id": job["id"], "key": key, "log": log_path}
        finally:
            carol.post(f"/v1/jobs/{job['id']}/cancel")
            wait_until(lambda: carol.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled", 120, what="the sleeper to stop")


class CountingTransport(httpx.HTTPTransport):
    """Records the path of every request the client makes."""

    def __init__(self, paths: list[str]):
        super().__init__()
        self.paths = paths

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


def sse_messages(lines: Iterator[str]) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
    block: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            block[name] = value.lstrip()
        elif "event" in block:
            yield block.get("id"), block["event"], json.loads(block.get("data", "null"))
            block = {}


def test_a_revoked_keys_open_streams_end(live: Live, sleeper: dict[str, Any]) -> None:
    key_id, key = live.new_key("carol")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=live.url, headers=headers, timeout=READ_TIMEOUT) as carol, \
            carol.stream("GET", f"/v1/jobs/{sleeper['id']}/events") as events, \
            carol.stream("GET", f"/v1/jobs/{sleeper['id']}/logs", params={"rank": 0, "stream": "stdout", "follow": "true"}) as logs:
        assert events.status_code == 200 and logs.status_code == 200
        messages = sse_messages(events.iter_lines())
        assert next(messages)[1] == "status"
        chunks = logs.iter_bytes()
        assert b"tick" in next(chunks)
        with live.admin() as admin:
            assert admin.delete(f"/v1/keys/{key_id}").status_code == 204
        # Both end (the job runs on): a stream that did not would hit the read timeout and fail the test.
        rest = list(messages)
        assert all(event != "reconnect" for _, event, _ in rest)  # ended by the key check, not by the lifetime
        list(chunks)
        again = carol.get(f"/v1/jobs/{sleeper['id']}")
        assert again.status_code == 401
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {sleeper['key']}"}) as carol_first:
        assert carol_first.get(f"/v1/jobs/{sleeper['id']}").json()["status"] == "running"  # her other key still works


def test_each_owner_holds_a_bounded_number_of_streams(live: Live, sleeper: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {sleeper['key']}"}
    cap = live.settings.max_streams_per_owner
    with httpx.Client(base_url=live.url, headers=headers, timeout=READ_TIMEOUT) as carol, live.tenant("dave") as dave:
        url = f"/v1/jobs/{sleeper['id']}/events"
        opened = [carol.stream("GET", url) for _ in range(cap)]
        responses = [s.__enter__() for s in opened]
        try:
            assert [r.status_code for r in responses] == [200] * cap
            over = carol.get(url)
            assert over.status_code == 429 and over.headers["content-type"].startswith("application/problem+json")
            assert "TORCHYARD_MAX_STREAMS_PER_OWNER" in over.json()["detail"] and over.headers["Retry-After"]
            follow = carol.get(f"/v1/jobs/{sleeper['id']}/logs", params={"follow": "true"})
            assert follow.status_code == 429  # followed logs count too
            assert carol.get(f"/v1/jobs/{sleeper['id']}/logs", params={"rank": 0, "stream": "stdout"}).status_code == 200
            # Another owner is not held back by carol's streams.
            dave_job = dave.post("/v1/jobs", json={"kind": "script", "name": "d", "entrypoint": "sibling.py", "queue": "gpu"}).json()
            with dave.stream("GET", f"/v1/jobs/{dave_job['id']}/events") as theirs:
                assert theirs.status_code == 200
        finally:
            opened[0].__exit__(None, None, None)
        # A closed stream gives its slot back (the server notices the disconnect at its next poll).
        def reopened() -> bool:
            with carol.stream("GET", url) as again:
                return again.status_code == 200
        wait_until(reopened, 30, what="a slot to be released")
        for s in opened[1:]:
            s.__exit__(None, None, None)


def test_a_followed_log_swapped_for_a_symlink_serves_none_of_its_target(live: Live, sleeper: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {sleeper['key']}"}
    log_path: Path = sleeper["log"]
    with httpx.Client(base_url=live.url, headers=headers, timeout=READ_TIMEOUT) as carol, \
            carol.stream("GET", f"/v1/jobs/{sleeper['id']}/logs", params={"rank": 0, "stream": "stdout", "follow": "true"}) as logs:
        chunks = logs.iter_bytes()
        served = next(chunks)
        link = log_path.with_name("swap.tmp")
        link.symlink_to("/proc/self/environ")
        os.replace(link, log_path)  # the rank keeps writing to the file it opened, now unlinked
        while served.count(b"\n") < 40:  # several more polls, 0.2 s apart
            served += next(chunks)
        assert b"TORCHYARD_" not in served and b"PATH=" not in served
        ticks = [int(line.split()[1]) for line in served.decode().splitlines() if line.startswith("tick ")]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # still the rank's own output, in order
    # A fresh request finds a symlink where the log was and serves nothing from it.
    with httpx.Client(base_url=live.url, headers=headers, timeout=READ_TIMEOUT) as carol:
        for params in ({"rank": 0, "stream": "stdout"}, {"rank": 0, "stream": "stdout", "tail": 5}):
            resp = carol.get(f"/v1/jobs/{sleeper['id']}/logs", params=params)
            assert resp.status_code == 404 and b"TORCHYARD_" not in resp.content


def test_a_followed_log_ends_at_its_lifetime_and_resumes_without_a_gap(live: Live, short_api: str, sleeper: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {sleeper['key']}"}
    params = {"rank": "0", "follow": "true"}  # output.log: the test above swapped stdout.log for a symlink
    received = b""
    with httpx.Client(base_url=short_api, headers=headers, timeout=READ_TIMEOUT) as carol:
        for _ in range(2):
            resp = carol.get(f"/v1/jobs/{sleeper['id']}/logs", params=params)
            text, marker, rest = resp.content.partition(b"\x1etorchyard-reconnect ")
            assert resp.status_code == 200 and marker and rest.endswith(b"\n"), resp.content[-300:]
            received += text
            params = {**params, "position": rest.decode().strip(), "attempt": resp.headers["x-log-attempt"]}
    # The two streams together are the file's first bytes: nothing lost or repeated across the reconnect.
    assert received and sleeper["log"].with_name("output.log").read_bytes().startswith(received)


def test_event_streams_end_at_their_lifetime_and_clients_resume(live: Live, short_api: str, sleeper: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {sleeper['key']}"}
    with httpx.Client(base_url=short_api, headers=headers, timeout=READ_TIMEOUT) as carol:
        with carol.stream("GET", f"/v1/jobs/{sleeper['id']}/events") as first:
            messages = list(sse_messages(first.iter_lines()))
        assert [m[1] for m in messages] == ["status", "reconnect"], messages
        assert messages[-1][0] == messages[0][0]  # nothing new happened: the same cursor to resume from
        resumed = carol.get(f"/v1/jobs/{sleeper['id']}/events", headers={"Last-Event-ID": messages[-1][0]})
        assert [m[1] for m in sse_messages(iter(resumed.text.splitlines() + [""]))] == ["reconnect"]  # no replayed status

    # The Python client resumes across lifetimes until the job ends; a cancel made meanwhile arrives once.
    opened = []
    transport = CountingTransport(opened)
    client = Client(short_api, sleeper["key"], transport=transport)
    path = f"/v1/jobs/{sleeper['id']}/events"

    def cancel_once_resumed_twice() -> None:
        # After two resumptions however long a loaded machine takes to make them, not after a fixed time.
        wait_until(lambda: opened.count(path) >= 3, 600, interval_s=0.05, what="the stream to be resumed twice")
        Client(short_api, sleeper["key"]).cancel(sleeper["id"])

    cancel = threading.Thread(target=cancel_once_resumed_twice, daemon=True)
    cancel.start()
    events = list(client.stream(sleeper["id"]))
    cancel.join(60)
    assert isinstance(events[-1], EndEvent) and events[-1].status == "cancelled"
    statuses = [e.status for e in events if isinstance(e, StatusEvent)]
    assert statuses == ["running", "cancelling", "cancelled"], statuses
    ids = [e.id for e in events if isinstance(e, StatusEvent)]
    assert len(ids) == len(set(ids))  # nothing replayed across the resumptions
    assert opened.count(path) >= 3  # opened once, resumed at least twice
