"""With TORCHYARD_STORAGE_URL the API serves a job's logs (merged, one rank, the launcher's; any attempt; tail,
follow, position) from what the worker uploaded to the store, though its own runs directory holds none of them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jobs.reads import job_logs
from jobs.settings import Settings
from jobs.store.models import Status
from jobs.store.states import transition
from tests.api.conftest import finish_job, mlp_spec, session_of, start_job
from tests.helpers import wait_until
from tests.object_store import ACCESS_KEY, SECRET_KEY, SeaweedS3
from worker.uploads import Uploads

pytestmark = pytest.mark.slow


def write_logs(run_dir: Path, attempt: int, run_id: str, restarts: int = 1) -> None:
    """torchrun --log-dir logs/attempt-<k> --redirects=3 and the ranks' files (trainer/rank_output.py) of a node with
    ranks 0 and 1, and of a second node whose one rank (local 0) is global rank 2 by its mark."""
    base = run_dir / "logs" / f"attempt-{attempt}"
    base.mkdir(parents=True, exist_ok=True)
    (base / "launcher.log").write_text(f"launcher of attempt {attempt}\n" + "".join(f"launcher line {i}\n" for i in range(5)))
    for restart in range(restarts):
        for rank in (0, 1):
            d = base / run_id / f"attempt_{restart}" / str(rank)
            d.mkdir(parents=True, exist_ok=True)
            (d / "stderr.log").write_text("".join(f"a{attempt} r{restart} rank{rank} err {i}\n" for i in range(10)))
            (d / "stdout.log").write_text(f"a{attempt} r{restart} rank{rank} out\n")
            (d / "output.log").write_text(f"a{attempt} r{restart} rank{rank} printed\n" + (d / "stderr.log").read_text())
            (d / "rank").write_text(str(rank))
    other = base / f"{run_id}-node1" / "attempt_0" / "0"
    other.mkdir(parents=True)
    (other / "rank").write_text("2")
    (other / "output.log").write_text(f"a{attempt} rank2 printed on node 1\n")
    (base / "ranks.log").write_text("".join(f"[rank {r}] a{attempt} line {i}\n" for i in range(3) for r in (0, 1)))
    (base / "ranks-node-1.log").write_text(f"[rank 2] a{attempt} node 1\n")


def _uploads(settings: Settings, job_id: str, host: Path) -> Uploads:
    """The worker's uploader of a run directory on another host than the API's."""
    return Uploads.of(settings, job_id, host / job_id)


def test_every_attempts_logs_come_from_the_store(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    job_id = client.post("/v1/jobs", json=mlp_spec(retries=1)).json()["id"]
    base = f"/v1/jobs/{job_id}/logs"
    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
    start_job(settings, job_id)
    assert client.get(base).status_code == 404  # running, nothing uploaded yet
    write_logs(host_a / job_id, 1, "none_aaa", restarts=2)
    assert _uploads(settings, job_id, host_a).sync()
    with session_of(settings) as s:  # host A is lost; attempt 2 runs on host B
        transition(s, job_id, Status.QUEUED, expect=[Status.RUNNING], reason="worker lost", values={"attempt": 2})
    start_job(settings, job_id, worker="worker-b")
    write_logs(host_b / job_id, 2, "none_bbb")
    assert _uploads(settings, job_id, host_b).sync()
    assert not any(p.is_file() for p in settings.runs_dir.rglob("*"))  # the API's runs directory has none of it

    merged = client.get(base)  # the current attempt: every node's merged log, node 0 first
    assert merged.status_code == 200 and merged.headers["X-Log-Attempt"] == "2"
    assert merged.text.splitlines() == [f"[rank {r}] a2 line {i}" for i in range(3) for r in (0, 1)] + ["[rank 2] a2 node 1"]
    assert client.get(base, params={"tail": 1}).text == "[rank 1] a2 line 2\n[rank 2] a2 node 1\n"
    assert client.get(base, params={"rank": "launcher", "tail": 2}).text == "launcher line 3\nlauncher line 4\n"
    assert client.get(base, params={"rank": 2}).text == "a2 rank2 printed on node 1\n"  # by its mark, not its local rank

    old = {"attempt": 1}
    assert client.get(base, params=old).text.startswith("[rank 0] a1 line 0\n")
    assert client.get(base, params={**old, "rank": "launcher"}).text.startswith("launcher of attempt 1\n")
    rank1 = client.get(base, params={**old, "rank": 1}).text  # the newest torchrun restart, as printed
    assert rank1.splitlines()[:2] == ["a1 r1 rank1 printed", "a1 r1 rank1 err 0"] and len(rank1.splitlines()) == 11
    assert client.get(base, params={**old, "rank": 1, "tail": 2}).text == "a1 r1 rank1 err 8\na1 r1 rank1 err 9\n"
    assert client.get(base, params={**old, "rank": 0, "stream": "stdout"}).text == "a1 r1 rank0 out\n"
    missing = client.get(base, params={**old, "rank": 7})
    assert missing.status_code == 404 and "rank 7" in missing.json()["detail"]
    assert client.get(base, params={"attempt": 3}).status_code == 404


def test_a_followed_log_streams_each_upload_until_the_job_ends(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    client.app.state.settings = settings.model_copy(  # type: ignore[attr-defined]
        update={"sse_poll_interval_s": 0.05, "storage_sync_interval_s": 0.2})
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    host = tmp_path / "host"
    written = [f"line {i}" for i in range(6)]

    def worker() -> None:
        start_job(settings, job_id)
        uploads = _uploads(settings, job_id, host)
        log = host / job_id / "logs" / "attempt-1" / "launcher.log"
        log.parent.mkdir(parents=True)
        for line in written:
            with log.open("a") as f:
                f.write(line + "\n")
            assert uploads.sync()
            time.sleep(0.3)
        assert uploads.finish(succeeded=True)  # the supervisor's last upload comes before the verdict
        finish_job(settings, job_id)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        # Followed from before anything is there (the job still queued) until the job is terminal.
        resp = client.get(f"/v1/jobs/{job_id}/logs", params={"rank": "launcher", "follow": "true"})
    finally:
        thread.join()
    assert resp.status_code == 200 and resp.text.splitlines() == written  # every line once, in order


def test_a_followed_log_resumes_from_its_position_and_waits_through_a_store_outage(
        client: TestClient, settings: Settings, tmp_path: Path, s3: SeaweedS3) -> None:
    short = settings.model_copy(update={"sse_poll_interval_s": 0.05, "storage_sync_interval_s": 0.2,
                                        "stream_max_lifetime_s": 1.0})
    client.app.state.settings = short  # type: ignore[attr-defined]
    job_id = client.post("/v1/jobs", json=mlp_spec()).json()["id"]
    start_job(settings, job_id)
    uploads = _uploads(settings, job_id, tmp_path / "host")
    log = tmp_path / "host" / job_id / "logs" / "attempt-1" / "ranks.log"
    log.parent.mkdir(parents=True)
    log.write_text("[rank 0] before\n")
    assert uploads.sync()

    first = client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true"})  # ends at its lifetime, the job running
    text, marker, rest = first.text.partition(job_logs.RECONNECT_MARKER)
    assert text == "[rank 0] before\n" and marker and rest.endswith("\n")
    position = rest.strip()

    s3.stop()
    try:
        down = client.get(f"/v1/jobs/{job_id}/logs")
    finally:
        s3.start()
    assert down.status_code == 503 and SECRET_KEY not in down.text and ACCESS_KEY not in down.text

    def outage() -> None:
        # Once the followed log below holds its stream (its files found), the store goes away for a while.
        wait_until(lambda: client.app.state.stream_slots.held() > 0, 60, what="the followed log to start")  # type: ignore[attr-defined]
        s3.stop()
        try:
            with log.open("a") as f:
                f.write("[rank 0] after\n")
            time.sleep(2)  # the stream polls a store that does not answer
        finally:
            s3.start()
        assert uploads.finish(succeeded=True)
        finish_job(settings, job_id)

    client.app.state.settings = short.model_copy(update={"stream_max_lifetime_s": 120.0})  # type: ignore[attr-defined]
    thread = threading.Thread(target=outage)
    thread.start()
    try:
        resumed = client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true", "position": position})
    finally:
        thread.join()
    assert resumed.text == "[rank 0] after\n"  # from where the first stream stopped, through the outage, to the end
