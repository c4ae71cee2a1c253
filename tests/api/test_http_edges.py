"""The HTTP edges a client meets: positions beyond SQL's integers, Allow on 405 and OPTIONS, byte ranges of downloads,
hard-linked artifacts, strict booleans in a spec, and an OpenAPI as strict as the server."""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from api.ranges import Unsatisfiable, byte_range
from jobs.reads import cursors, job_logs
from jobs.settings import Settings
from tests.api.conftest import finish_job, ingest, metric_event, mlp_spec, start_job
from tests.helpers import ADMIN_TOKEN
from torchyard.client import Client


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def _job(client: TestClient, settings: Settings) -> tuple[str, Path]:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    return job["id"], start_job(settings, job["id"])


def _field_of(resp: object) -> list[str]:
    return [e["field"] for e in resp.json()["errors"]]  # type: ignore[attr-defined]


def test_positions_beyond_sql_integers_answer_422_naming_the_field(client: TestClient, settings: Settings) -> None:
    job_id, _ = _job(client, settings)
    ingest(settings, job_id, [metric_event(i, i) for i in range(1, 4)])
    overflow = base64.b64encode(b"99999999999999999999|train/loss").decode()  # the step of the report: beyond 64 bits
    for cursor in (overflow, "9223372036854775808.6c6f7373", "1.", "01.6c", "x"):
        resp = client.get(f"/v1/jobs/{job_id}/metrics", params={"cursor": cursor})
        assert resp.status_code == 422, (cursor, resp.text)
        assert resp.headers["content-type"] == "application/problem+json" and _field_of(resp) == ["cursor"]
        assert resp.json()["errors"][0]["message"] == "malformed cursor; pass back a next_cursor this server returned"
    # The largest position there is answers an empty page; pages chain as before.
    last = client.get(f"/v1/jobs/{job_id}/metrics", params={"cursor": f"{cursors.SQL_INT_MAX}.{'ff' * 3}"})
    assert last.status_code == 200 and last.json()["items"] == []
    # A name with NUL is still a position, on PostgreSQL too (which refuses NUL in text): after "\0" is after "".
    after_nul = client.get(f"/v1/jobs/{job_id}/metrics", params={"cursor": "2.00"})
    assert after_nul.status_code == 200 and [p["step"] for p in after_nul.json()["items"]] == [2, 3], after_nul.text
    page = client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 2}).json()
    rest = client.get(f"/v1/jobs/{job_id}/metrics", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [p["step"] for p in page["items"] + rest["items"]] == [1, 2, 3] and rest["next_cursor"] is None
    for cursor in ("zz", "0" * 33):
        assert _field_of(client.get("/v1/jobs", params={"cursor": cursor})) == ["cursor"]
    assert client.get(f"/v1/jobs/{job_id}/metrics", params={"since_step": 2**63}).status_code == 422

    # An event id beyond its 32-bit columns is refused before the stream starts, as a header and as the query parameter.
    for headers, params, field in (({"Last-Event-ID": "99999999999999999999-0"}, {}, "Last-Event-ID"),
                                   ({}, {"last_event_id": "0-9223372036854775808"}, "last_event_id"),
                                   ({"Last-Event-ID": "9223367774529654117-1"}, {}, "Last-Event-ID"),
                                   ({}, {"last_event_id": f"0-0-{cursors.SQL_INT4_MAX + 1}"}, "last_event_id"),
                                   ({"Last-Event-ID": "1-2-3-4"}, {}, "Last-Event-ID")):
        resp = client.get(f"/v1/jobs/{job_id}/events", headers=headers, params=params)
        assert resp.status_code == 422 and _field_of(resp) == [field], resp.text
        assert resp.json()["errors"][0]["message"] == "malformed event id; use the id of a message this stream sent"
    finish_job(settings, job_id)
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "-".join([str(cursors.SQL_INT4_MAX)] * 3)}) as s:
        assert s.status_code == 200
        assert "event: end" in s.read().decode()


@given(st.integers(min_value=0, max_value=2**70))
def test_the_number_pattern_is_exactly_the_sql_range(n: int) -> None:
    assert bool(re.fullmatch(cursors.uint_pattern(cursors.SQL_INT_MAX), str(n))) == (n <= cursors.SQL_INT_MAX)
    assert not re.fullmatch(cursors.uint_pattern(cursors.SQL_INT_MAX), f"0{n}")  # no leading zeros


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**6))
def test_the_number_pattern_of_any_limit(limit: int, n: int) -> None:
    assert bool(re.fullmatch(cursors.uint_pattern(limit), str(n))) == (n <= limit)


@given(st.integers(min_value=0, max_value=cursors.SQL_INT_MAX), st.text(min_size=1, max_size=128))
def test_a_metric_cursor_round_trips(step: int, name: str) -> None:
    raw = cursors.metric_cursor(step, name)
    assert re.fullmatch(cursors.METRIC_CURSOR, raw) and len(raw) <= cursors.METRIC_CURSOR_MAX
    # Cut at a NUL, which no stored name holds (see parse_metric_cursor).
    expected = name.encode("utf-8", "replace").decode("utf-8", "replace").split("\0", 1)[0]
    assert cursors.parse_metric_cursor(raw) == (step, expected)


def test_every_405_and_options_answer_lists_every_method_of_the_path(client: TestClient) -> None:
    digest = "sha256:" + "0" * 64
    expected = {"/v1/jobs/abc": "DELETE, GET, OPTIONS, PATCH", "/v1/keys": "GET, OPTIONS, POST", "/v1/keys/abc": "DELETE, OPTIONS",
                f"/v1/code/{digest}": "GET, HEAD, OPTIONS", "/v1/jobs": "GET, OPTIONS, POST",
                "/v1/jobs/abc/cancel": "OPTIONS, POST"}
    for path, allow in expected.items():
        options = client.options(path)
        assert options.status_code == 204 and options.headers["allow"] == allow, (path, options.headers)
        refused = client.request("PUT", path)
        assert refused.status_code == 405 and refused.headers["allow"] == allow
        assert refused.headers["content-type"] == "application/problem+json" and "PUT" in refused.json()["detail"]
    # A path no route has is a 404 for every method, not a 405 with an empty Allow.
    for method in ("OPTIONS", "GET", "POST", "DELETE"):
        for path in ("/v1/nothing-here", "/v1/jobs/abc/nothing", "/v1/jobs/..%2Fkeys%2Fabc", "/nothing"):
            missing = client.request(method, path)
            assert missing.status_code == 404 and "allow" not in missing.headers, (method, path, missing.text)
            assert missing.json()["detail"] == "no such path in this API (see /docs)"


def test_profile_memory_is_a_boolean_not_a_number(client: TestClient) -> None:
    for memory in (0, 1, "true"):
        resp = client.post("/v1/jobs", json=mlp_spec(profile={"start_step": 1, "memory": memory}))
        assert resp.status_code == 422 and _field_of(resp) == ["profile.memory"], resp.text
    assert client.post("/v1/jobs", json=mlp_spec(profile={"start_step": 1, "memory": True})).status_code == 201


def test_artifact_downloads_honour_one_range_and_refuse_hard_links(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    job_id, run_dir = _job(client, settings)
    art = run_dir / "artifacts"
    art.mkdir()
    (art / "trace.bin").write_bytes(bytes(range(100)))
    outside = tmp_path / "not-the-jobs.txt"
    outside.write_text("the API must not serve this")
    os.link(outside, art / "planted.txt")
    url = f"/v1/jobs/{job_id}/artifacts/trace.bin"

    whole = client.get(url)
    assert whole.status_code == 200 and whole.content == bytes(range(100)) and whole.headers["accept-ranges"] == "bytes"
    for header, body, content_range in (("bytes=10-19", bytes(range(10, 20)), "bytes 10-19/100"),
                                        ("bytes=90-", bytes(range(90, 100)), "bytes 90-99/100"),
                                        ("bytes=-5", bytes(range(95, 100)), "bytes 95-99/100"),
                                        ("bytes=98-1000", bytes([98, 99]), "bytes 98-99/100")):
        part = client.get(url, headers={"Range": header})
        assert part.status_code == 206 and part.content == body and part.headers["content-range"] == content_range, header
    for header in ("bytes=100-", "bytes=-0", "bytes=500-600"):
        refused = client.get(url, headers={"Range": header})
        assert refused.status_code == 416 and refused.headers["content-range"] == "bytes */100", header
        assert refused.headers["content-type"] == "application/problem+json"
    for header in ("bytes=0-1,5-6", "items=0-1", "bytes=9-3"):  # several ranges, another unit, backwards: the whole file
        assert client.get(url, headers={"Range": header}).content == bytes(range(100)), header

    # A hard link is neither listed nor served, like a symlink; neither is a log swapped for one.
    assert [i["path"] for i in client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]] == ["trace.bin"]
    assert client.get(f"/v1/jobs/{job_id}/artifacts/planted.txt").status_code == 404
    logs = run_dir / "logs" / "attempt-1"
    logs.mkdir(parents=True)
    os.link(outside, logs / "launcher.log")
    resp = client.get(f"/v1/jobs/{job_id}/logs", params={"rank": "launcher"})
    assert resp.status_code == 404 and b"must not" not in resp.content


@given(st.integers(min_value=0, max_value=1000), st.integers(min_value=0, max_value=1200), st.integers(min_value=0, max_value=1200))
def test_byte_range_is_inside_the_file_or_refused(size: int, first: int, last: int) -> None:
    for header in (f"bytes={first}-{last}", f"bytes={first}-", f"bytes=-{last}"):
        try:
            wanted = byte_range(header, size)
        except Unsatisfiable:
            assert size == 0 or first >= size or header.endswith("=-0") or header == f"bytes=-{last}" and last == 0
            continue
        if wanted is not None:
            start, end = wanted
            assert 0 <= start < end <= size


def test_a_followed_log_ends_at_its_lifetime_and_resumes_where_it_stopped(client: TestClient, settings: Settings) -> None:
    client.app.state.settings = settings.model_copy(update={"sse_poll_interval_s": 0.05, "stream_max_lifetime_s": 0.4})  # type: ignore[attr-defined]
    job_id, run_dir = _job(client, settings)
    log_file = run_dir / "logs" / "attempt-1" / "launcher.log"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("line 0\nline 1\npartial")
    url = f"/v1/jobs/{job_id}/logs"

    first = client.get(url, params={"rank": "launcher", "follow": "true"})
    assert first.status_code == 200 and first.headers["x-log-attempt"] == "1"
    text, marker, rest = first.text.partition(job_logs.RECONNECT_MARKER)
    assert text == "line 0\nline 1\npartial" and marker and rest.endswith("\n")
    position = rest.strip()
    with log_file.open("a") as f:
        f.write(" line\nline 2\n")
    again = client.get(url, params={"rank": "launcher", "follow": "true", "position": position, "tail": 1})
    assert again.text.partition(job_logs.RECONNECT_MARKER)[0] == " line\nline 2\n"
    # Without follow the position is where the file is read from; a malformed one is refused by name.
    assert client.get(url, params={"rank": "launcher", "position": position}).text == " line\nline 2\n"
    # An empty position (the marker of a stream that had no file open yet) starts every file from its beginning.
    assert client.get(url, params={"rank": "launcher", "position": "", "tail": 1}).text.startswith("line 0\n")
    bad = client.get(url, params={"rank": "launcher", "position": "99999999999999999999"})
    assert bad.status_code == 422 and _field_of(bad) == ["position"]
    assert bad.json()["errors"][0]["message"] == "malformed position; pass back the one a followed log ended with"

    # The client resumes by itself, on the same attempt, and shows no marker: every line once.
    def finish_later() -> None:
        time.sleep(1.0)
        with log_file.open("a") as f:
            f.write("line 3\n")
        time.sleep(0.6)
        finish_job(settings, job_id)

    thread = threading.Thread(target=finish_later)
    thread.start()
    followed = "".join(Client("http://testserver", ADMIN_TOKEN, transport=client._transport).follow_logs(job_id, rank="launcher"))  # type: ignore[attr-defined]
    thread.join()
    assert followed == "line 0\nline 1\npartial line\nline 2\nline 3\n"


@given(st.dictionaries(st.text(min_size=1, max_size=40), st.integers(min_value=0, max_value=cursors.SQL_INT_MAX), max_size=8))
def test_a_log_position_round_trips(offsets: dict[str, int]) -> None:
    raw = job_logs.encode_position(offsets)
    assert re.fullmatch(job_logs.POSITION_PATTERN, raw) and len(raw) <= job_logs.POSITION_MAX
    decoded = job_logs.decode_position(raw)
    assert all(decoded[job_logs.file_key(name)] == offset for name, offset in offsets.items()
               if sum(job_logs.file_key(n) == job_logs.file_key(name) for n in offsets) == 1)
