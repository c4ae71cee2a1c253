"""``python -m stack`` as a user runs it, from an empty directory: its own Redis with a password nobody else can
read, var/ and the SQLite file out of other uids' reach, the API and worker restarted when killed, and the ready
block printed once the API answers."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from redis import Redis

from stack import isolation
from stack.redis_server import free_port, probe
from tests.helpers import ROOT, interpreter_reach, wait_until
from tests.uid_blocks import uid_block

pytestmark = pytest.mark.slow

OTHER_UID = ["setpriv", "--reuid=20001", "--regid=20001", "--clear-groups"]
TINY_JOB = {
    "name": "after-a-restart", "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 256}},
    "parallel": {"nproc_per_node": 1}, "train": {"epochs": 1, "global_batch_size": 64, "lr": 0.001},
}


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    cwd: Path
    log: Path
    url: str
    answered_at_block: bool = False

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def child(self, marker: str) -> psutil.Process | None:
        """The stack's child whose command line holds ``marker`` (``-m api``, ``-m worker``, ``redis-server``)."""
        for child in psutil.Process(self.proc.pid).children():
            try:
                if marker in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                    return child
            except psutil.Error:
                continue
        return None

    def redis_url(self) -> str:
        worker = self.child("-m worker")
        assert worker is not None
        return worker.environ()["TORCHYARD_REDIS_URL"]

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def headers(self) -> dict[str, str]:
        token = self.output().split("admin token: ", 1)[1].split()[0]
        return {"Authorization": f"Bearer {token}"}


def _start(cwd: Path, port: int, log_name: str = "stack.log") -> Stack:
    """``python -m stack`` in ``cwd``, once its ready block is out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    # Where the stack would run jobs under uids of their own (root, an interpreter other uids can start), a worker
    # kills whatever runs as a uid it gives an attempt: this process's own block, never the default range that a
    # second copy of the suite (or `make run`) takes too. Elsewhere jobs run as this user and the stack says so.
    if "TORCHYARD_JOB_UIDS" in isolation.choose(env, ROOT)[0]:
        env["TORCHYARD_JOB_UIDS"] = "{}-{}".format(*uid_block())
    log = cwd / log_name
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stack", "--port", str(port)], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    running = Stack(proc, cwd, log, f"http://127.0.0.1:{port}")
    # The log first, then /readyz: once the block is out, the API must already answer (before, the line came
    # about 3 s early). Polled fast enough to catch a block printed before the API listens.
    wait_until(lambda: "stop:        Ctrl+C" in running.output() or proc.poll() is not None, 90, interval_s=0.05,
               what="the ready block")
    running.answered_at_block = running.answers()
    assert proc.poll() is None, running.output()
    return running


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _interpreter_reach_kept() -> Iterator[None]:
    """Whether the stacks of this module run jobs under uids of their own stays as they found it (tests/helpers.py)."""
    with interpreter_reach(exclusive=False):
        yield


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # Not under pytest's 0700 tmp directory: the other uid must be able to reach var/ for its refusals to mean anything.
    cwd = Path(tempfile.mkdtemp(prefix="torchyard-stack-"))
    cwd.chmod(0o755)
    holder: list[Stack] = []
    try:
        holder.append(_start(cwd, free_port()))
        yield holder[0]
    finally:
        if holder:
            _stop(holder[0].proc)
        shutil.rmtree(cwd, ignore_errors=True)


def test_the_ready_block_comes_after_readyz_answers_and_is_last(stack: Stack) -> None:
    assert stack.answered_at_block
    out = stack.output()
    ready_at = out.index("torchyard is up at")
    assert "Uvicorn running on" in out[:ready_at] and "taking tasks from host:local-0" in out[:ready_at]
    # Nothing after it but the access lines of this test's own /readyz probes.
    tail = [line for line in out[ready_at:].splitlines() if "api.access" not in line]
    assert [line.split(":", 1)[0].strip() for line in tail[1:]] == ["jobs", "admin token", "try", "CLI", "stop"], tail
    # Root, but pytest's interpreter may live where other uids cannot start it: either way the block says which.
    first, last = uid_block()
    assert f"jobs run under uids {first}-{last} (TORCHYARD_JOB_UIDS)" in tail[1] or "jobs run as uid" in tail[1], tail[1]
    assert "curl -H 'Authorization: Bearer " in tail[3]
    # No lines of Alembic's (its context, plugins, each revision); one line says what the schema became.
    assert "alembic" not in out and "database schema upgraded from empty to " in out, out[:3000]


def test_its_own_redis_requires_a_password_that_no_command_line_shows(stack: Stack) -> None:
    url = stack.redis_url()
    parts = urlsplit(url)
    assert parts.password and parts.port != 6379
    assert "a private redis-server at redis://:***@127.0.0.1:" in stack.output()
    assert parts.password not in stack.output()
    with pytest.raises(Exception, match="(?i)auth"):
        probe(f"redis://127.0.0.1:{parts.port}/0").ping()
    assert Redis.from_url(url).ping()
    for proc in psutil.process_iter(["cmdline"]):
        assert parts.password not in " ".join(proc.info["cmdline"] or []), proc


def _as_other_uid(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OTHER_UID, "bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=30)


def test_var_and_the_database_are_out_of_another_uids_reach(stack: Stack) -> None:
    var = stack.cwd / "var"
    assert stat.S_IMODE(var.stat().st_mode) == 0o711
    assert stat.S_IMODE((var / "redis").stat().st_mode) == 0o700
    for name in ("torchyard.db", "torchyard.db-wal", "torchyard.db-shm"):
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to another uid needs root and setpriv (util-linux)")
    (var / "probe.txt").write_text("reachable\n")
    (var / "probe.txt").chmod(0o644)
    assert _as_other_uid("cat var/probe.txt", stack.cwd).stdout == "reachable\n"  # var/ can be passed through
    assert _as_other_uid("ls var", stack.cwd).returncode != 0  # but not listed
    for name in ("torchyard.db", "torchyard.db-wal"):
        refused = _as_other_uid(f"cat var/{name} > /dev/null", stack.cwd)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, name
        assert _as_other_uid(f"echo x >> var/{name}", stack.cwd).returncode != 0, name

    port = urlsplit(stack.redis_url()).port
    ping = _as_other_uid(f"exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'PING\\r\\nKEYS *\\r\\n' >&3; "
                         "read -t 5 a <&3; read -t 5 b <&3; echo \"$a|$b\"", stack.cwd)
    assert ping.stdout.count("NOAUTH") == 2, ping


def test_a_killed_worker_comes_back_under_its_name_and_runs_a_job(stack: Stack) -> None:
    redis = Redis.from_url(stack.redis_url(), decode_responses=True)
    worker = stack.child("-m worker")
    assert worker is not None
    worker.kill()
    answered = 0

    def back() -> bool:
        nonlocal answered
        answered += stack.answers()
        new = stack.child("-m worker")
        return new is not None and new.pid != worker.pid and redis.hget("rq:worker:local-0", "pid") == str(new.pid)

    wait_until(back, 180, interval_s=0.3, what="a new worker registered as local-0")
    assert answered > 0 and stack.answers()  # the API kept answering
    out = stack.output()
    assert f"worker local-0 (pid {worker.pid}) exited with signal 9" in out
    assert "There exists an active worker" not in out

    with httpx.Client(base_url=stack.url, headers=stack.headers(), timeout=10) as client:
        created = client.post("/v1/jobs", json=TINY_JOB)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        status = wait_until(lambda: (s := client.get(f"/v1/jobs/{job_id}").json()["status"]) in ("succeeded", "failed", "cancelled")
                            and s, 300, interval_s=0.5, what="the job to end")
    assert status == "succeeded", stack.output()[-3000:]


def test_a_killed_api_comes_back(stack: Stack) -> None:
    api = stack.child("-m api")
    assert api is not None
    api.kill()
    wait_until(lambda: (new := stack.child("-m api")) is not None and new.pid != api.pid and stack.answers(), 180,
               interval_s=0.3, what="the API back")
    assert f"api (pid {api.pid}) exited with signal 9" in stack.output()
    assert stack.proc.poll() is None


def _tokens(out: str) -> list[str]:
    return [part.split()[0] for part in out.split("admin token: ")[1:]]


def test_a_restart_keeps_the_admin_token_so_a_saved_login_still_works(stack: Stack) -> None:
    """Last in this file: it stops the module's stack and starts it again in the same directory."""
    first = _tokens(stack.output())
    kept = stack.cwd / "var" / "admin-token"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert kept.read_text().strip() == first[0]
    _stop(stack.proc)
    again = _start(stack.cwd, int(urlsplit(stack.url).port or 0), "restarted.log")
    stack.proc = again.proc  # the fixture stops this one
    assert len(first) == 1 and _tokens(again.output()) == first
    with httpx.Client(base_url=again.url, headers=again.headers(), timeout=10) as client:
        assert client.get("/v1/jobs").status_code == 200
