"""Redis with ``requirepass``, as compose runs it. The package's live API, worker and RQ already run against
one (every other test here); this adds the local runner: ``torchyard up`` uses a password-bearing
TORCHYARD_REDIS_URL, never logs the password, and refuses a wrong one instead of starting a Redis of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from redis import Redis

from stack.redis_server import free_port
from tests.helpers import ADMIN_TOKEN, ROOT, wait_for_api, wait_until
from tests.security.conftest import Live

pytestmark = pytest.mark.slow


def _env(live: Live, tmp_path: Path, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env.update({
        "TORCHYARD_REDIS_URL": redis_url, "TORCHYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'up.db'}",
        "TORCHYARD_ADMIN_TOKEN": ADMIN_TOKEN, "TORCHYARD_RUNS_DIR": str(tmp_path / "runs"), "TORCHYARD_DATA_DIR": str(tmp_path),
        "TORCHYARD_CODE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
    })
    return env


def test_torchyard_up_uses_a_password_protected_redis(live: Live, tmp_path: Path) -> None:
    password = live.redis_server.password
    assert password
    # Database 1 of the same server: this stack's worker must not take the package's jobs from database 0.
    url = live.redis_server.url.removesuffix("/0") + "/1"
    port = free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "torchyard", "up", "--port", str(port)], env=_env(live, tmp_path, url), cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_api(proc, f"http://127.0.0.1:{port}", log_path)  # readyz pings Redis with the password
        resp = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert resp.status_code == 200
        # The API answers before its worker has registered: wait for the worker to join, through the password.
        wait_until(lambda: any(b"local-0" in w for w in Redis.from_url(url).smembers("rq:workers")), 300,
                   what="the stack's worker in rq:workers")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    output = log_path.read_text()
    assert "using the Redis at redis://:***@" in output and password not in output
    assert "started a private redis-server" not in output


def test_a_wrong_redis_password_is_refused_not_worked_around(live: Live, tmp_path: Path) -> None:
    url = live.redis_server.url.replace(f":{live.redis_server.password}@", ":wrong-password@")
    done = subprocess.run([sys.executable, "-m", "stack", "--port", str(free_port())], env=_env(live, tmp_path, url), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "refuses the password" in done.stderr and "wrong-password" not in done.stderr
    assert not (tmp_path / "var" / "redis").exists()  # no private Redis was started instead
