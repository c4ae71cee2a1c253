"""GET /v1/jobs/{id}/logs: all ranks merged (the default), a rank as printed, one stream, the launcher log,
as torchrun and the ranks lay them out; tail, follow, attempt."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jobs.reads import job_logs as job_logs_files
from jobs.settings import Settings
from jobs.store.models import Status
from jobs.store.states import transition
from tests.api.conftest import finish_job, mlp_spec, session_of, start_job
from tests.helpers import told_when_called


def write_logs(run_dir: Path, attempt: int, torchrun_id: str = "none_abc123", restarts: int = 1, ranks: int = 2) -> None:
    """The layout of ``torchrun --log-dir runs/<id>/logs/attempt-<k> --redirects=3``."""
    base = run_dir / "logs" / f"attempt-{attempt}"
    base.mkdir(parents=True, exist_ok=True)
    (base / "launcher.log").write_text(f"launcher of attempt {attempt}\n" + "".join(f"launcher line {i}\n" for i in range(5)))
    for restart in range(restarts):
        for rank in range(ranks):
            d = base / torchrun_id / f"attempt_{restart}" / str(rank)
            d.mkdir(parents=True, exist_ok=True)
            (d / "stderr.log").write_text("".join(f"a{attempt} r{restart} rank{rank} err {i}\n" for i in range(10)))
            (d / "stdout.log").write_text(f"a{attempt} r{restart} rank{rank} out\n")
            if restart == restarts - 1:  # as printed: stdout and stderr in one file (trainer/rank_output.py)
                (d / "output.log").write_text(f"a{attempt} rank{rank} printed\n" + (d / "stderr.log").read_text())
    (base / "ranks.log").write_text("".join(f"[rank {r}] a{attempt} line {i}\n" for i in range(3) for r in range(ranks)))


def test_launcher_and_rank_logs_with_tail(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    base = f"/v1/jobs/{job['id']}/logs"
    assert client.get(base).status_code == 404  # queued: nothing written yet
    run_dir = start_job(settings, job["id"])
    write_logs(run_dir, 1, restarts=2)

    merged = client.get(base)  # the default: every rank, each line prefixed
    assert merged.status_code == 200 and merged.headers["content-type"].startswith("text/plain")
    assert merged.text.splitlines()[:2] == ["[rank 0] a1 line 0", "[rank 1] a1 line 0"]
    assert client.get(base, params={"tail": 1}).text == "[rank 1] a1 line 2\n"

    launcher = client.get(base, params={"rank": "launcher"})
    assert launcher.text.startswith("launcher of attempt 1\n") and launcher.text.endswith("launcher line 4\n")
    assert client.get(base, params={"rank": "launcher", "tail": 2}).text == "launcher line 3\nlauncher line 4\n"
    assert client.get(base, params={"rank": "launcher", "tail": 1000}).text == launcher.text

    rank1 = client.get(base, params={"rank": 1}).text  # newest torchrun restart, as printed by default
    assert rank1.splitlines()[:2] == ["a1 rank1 printed", "a1 r1 rank1 err 0"] and len(rank1.splitlines()) == 11
    assert client.get(base, params={"rank": 1, "tail": 3}).text.splitlines() == [f"a1 r1 rank1 err {i}" for i in (7, 8, 9)]
    assert client.get(base, params={"rank": 1, "stream": "stderr"}).text.splitlines()[0] == "a1 r1 rank1 err 0"
    assert client.get(base, params={"rank": 0, "stream": "stdout"}).text == "a1 r1 rank0 out\n"
    missing = client.get(base, params={"rank": 7})
    assert missing.status_code == 404 and "rank 7" in missing.json()["detail"]
    for bad in ({"rank": "-1"}, {"rank": "all"}, {"stream": "stdout"}, {"rank": "launcher", "stream": "stderr"}):
        refused = client.get(base, params=bad)
        assert refused.status_code == 422, (bad, refused.text)


def test_logs_of_an_earlier_attempt(client: TestClient, settings: Settings) -> None:
    job = client.post("/v1/jobs", json=mlp_spec(retries=1)).json()
    run_dir = start_job(settings, job["id"])
    write_logs(run_dir, 1)
    with session_of(settings) as s:
        transition(s, job["id"], Status.QUEUED, expect=[Status.RUNNING], reason="retrying", values={"attempt": 2})
    start_job(settings, job["id"])
    write_logs(run_dir, 2, torchrun_id="none_def456")
    base = f"/v1/jobs/{job['id']}/logs"
    assert client.get(base, params={"rank": "launcher"}).text.startswith("launcher of attempt 2")
    assert client.get(base, params={"rank": "launcher", "attempt": 1}).text.startswith("launcher of attempt 1")
    assert client.get(base, params={"attempt": 1}).text.startswith("[rank 0] a1 line 0")
    assert client.get(base, params={"attempt": 1, "rank": 0}).text.startswith("a1 rank0 printed")
    assert client.get(base, params={"attempt": 2, "rank": 0, "stream": "stderr"}).text.startswith("a2 r0 rank0")
    assert client.get(base, params={"attempt": 3}).status_code == 404


def test_follow_streams_appended_lines_until_the_job_ends(client: TestClient, settings: Settings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    client.app.state.settings = settings.model_copy(update={"sse_poll_interval_s": 0.05})  # type: ignore[attr-defined]
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    first_read = told_when_called(monkeypatch, job_logs_files, "job_log")

    def worker() -> None:
        # The job starts once the follower has read it queued, however long a loaded machine takes to get there.
        assert first_read.wait(600), "the follower never read the job"
        run_dir = start_job(settings, job["id"])
        time.sleep(0.2)
        write_logs(run_dir, 1)
        path = next(run_dir.glob("logs/attempt-1/*/attempt_0/0/output.log"))
        for i in range(3):
            time.sleep(0.1)
            with path.open("a") as f:
                f.write(f"appended {i}\n")
        time.sleep(0.1)
        finish_job(settings, job["id"])

    thread = threading.Thread(target=worker)
    thread.start()
    # Follows from before the file exists (job still queued) until the job is terminal.
    resp = client.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 0, "follow": "true", "tail": 2})
    thread.join()
    assert resp.status_code == 200
    lines = resp.text.splitlines()
    assert lines[-3:] == ["appended 0", "appended 1", "appended 2"]
    # The last 2 lines of the file when the follower first saw it (on a busy machine, maybe after an append), then
    # every line after them: the file's end, nothing dropped or repeated.
    written = ["a1 rank0 printed", *(f"a1 r0 rank0 err {i}" for i in range(10)), "appended 0", "appended 1", "appended 2"]
    assert lines == written[len(written) - len(lines):] and lines[0] in ("a1 r0 rank0 err 8", "a1 r0 rank0 err 9", "appended 0")


def test_log_paths_cannot_leave_the_run_directory(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    job = client.post("/v1/jobs", json=mlp_spec()).json()
    run_dir = start_job(settings, job["id"])
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    logs = run_dir / "logs" / "attempt-1"
    logs.mkdir(parents=True)
    os.symlink(secret, logs / "launcher.log")
    os.symlink(secret, logs / "ranks.log")
    for rank in ("launcher", None):
        resp = client.get(f"/v1/jobs/{job['id']}/logs", params={"rank": rank} if rank else {})
        assert resp.status_code == 404 and "top secret" not in resp.text
    finish_job(settings, job["id"])
    assert client.get(f"/v1/jobs/{job['id']}/logs", params={"follow": "true"}).text == ""
