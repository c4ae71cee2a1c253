"""The private redis-server: its configuration, password included, goes in through standard input, never argv
(``/proc/PID/cmdline`` is readable by every user); its data directory is 0700. And a worker killed without
deregistering does not keep its name from the worker restarted after it."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import AuthenticationError, ResponseError
from rq import Worker

from stack.redis_server import RedisServer, probe
from tests.helpers import ROOT
from worker.rq_worker import TorchyardWorker


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendonly=True, password=secrets.token_urlsafe(32)).start()
    yield server
    server.stop()


def test_the_password_is_required_and_in_no_command_line(private_redis: RedisServer) -> None:
    assert private_redis.proc is not None and private_redis.password
    cmdline = Path(f"/proc/{private_redis.proc.pid}/cmdline").read_bytes()
    assert private_redis.password.encode() not in cmdline
    assert b"requirepass" not in cmdline
    with pytest.raises((AuthenticationError, ResponseError)):
        probe(f"redis://127.0.0.1:{private_redis.port}/0").ping()
    with pytest.raises(AuthenticationError):
        probe(f"redis://:wrong@127.0.0.1:{private_redis.port}/0").ping()
    assert Redis.from_url(private_redis.url).ping()
    assert (private_redis.workdir.stat().st_mode & 0o777) == 0o700


def test_a_path_with_spaces_and_quotes_is_quoted(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / 'a "b" c', password='p"w\\d').start()
    try:
        client = Redis(port=server.port, password='p"w\\d')
        assert client.config_get("dir")["dir"] == str((tmp_path / 'a "b" c').resolve())
    finally:
        server.stop()


REGISTER_AND_SLEEP = """
import sys, time
from redis import Redis
from rq import Worker
Worker(["default"], name=sys.argv[2], connection=Redis.from_url(sys.argv[1])).register_birth()
print("registered", flush=True)
time.sleep(600)
"""


def _registered_then(url: str, name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", REGISTER_AND_SLEEP, url, name], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"
    return proc


def test_a_killed_workers_name_is_free_again_at_once(private_redis: RedisServer) -> None:
    connection = Redis.from_url(private_redis.url)
    old = _registered_then(private_redis.url, "local-0")
    old.send_signal(signal.SIGKILL)
    old.wait()
    with pytest.raises(ValueError, match="active worker named 'local-0'"):
        Worker(["default"], name="local-0", connection=connection).register_birth()  # RQ alone: refused for minutes

    worker = TorchyardWorker(["default"], name="local-0", connection=connection)
    worker.register_birth()
    assert connection.hget(worker.key, "pid") == str(worker.pid).encode()
    assert worker.key.encode() in connection.smembers("rq:workers")
    worker.register_death()


def test_a_live_namesake_keeps_its_name(private_redis: RedisServer) -> None:
    connection = Redis.from_url(private_redis.url)
    alive = _registered_then(private_redis.url, "local-1")
    try:
        with pytest.raises(ValueError, match="active worker named 'local-1'"):
            TorchyardWorker(["default"], name="local-1", connection=connection).register_birth()
        assert alive.poll() is None
    finally:
        alive.kill()
        alive.wait()


def test_the_stack_isolates_jobs_only_where_a_job_uid_can_start_python(tmp_path: Path) -> None:
    from stack import isolation

    closed = tmp_path / "closed"
    (closed / "code").mkdir(parents=True)
    closed.chmod(0o700)
    assert not isolation.reachable_by_others(closed / "code")
    env, line = isolation.choose({}, closed / "code")
    assert env == {"TORCHYARD_SINGLE_USER": "true"} and "TORCHYARD_JOB_UIDS" in line
    assert isolation.choose({"TORCHYARD_JOB_UIDS": "30000-30009"}, closed) == ({}, "jobs run under uids 30000-30009 (TORCHYARD_JOB_UIDS)")
    assert isolation.choose({"TORCHYARD_SINGLE_USER": "false"}, closed)[0] == {}
