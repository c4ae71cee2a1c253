"""``python -m stack``: run the whole service locally on the CPU.

Starts the API and worker(s) with SQLite under ./var, and its own private redis-server (a random password, given
through standard input) unless TORCHYARD_REDIS_URL is set. Restarts the API or a worker that exits; stops everything
on SIGINT/SIGTERM. Prints the URL, the admin token and a curl line once the API answers /readyz.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from redis import Redis
from redis.exceptions import RedisError
from sqlmodel import Session

from jobs.infra import logconfig
from jobs.scheduling import leader
from jobs.settings import get_settings
from jobs.store.db import get_engine
from jobspec.pdeathsig import set_not_dumpable
from stack import isolation
from stack.children import Child, stop_all
from stack.redis_server import RedisServer, answers, masked, refuses_auth

log = logging.getLogger("torchyard.stack")

VAR = Path("var")
READY_TIMEOUT_S = 120.0
# The admin token made on the first start, kept so a saved `torchyard login` still works after a restart.
ADMIN_TOKEN_FILE = VAR / "admin-token"


def protect_var(database_url: str) -> None:
    """``var/`` 0711: a job's uid may pass through it to its run directory (``var/runs/<id>``) but list nothing. The
    SQLite file and its companions 0600, the file created so before any process opens it (SQLite gives -wal and
    -shm the main file's mode)."""
    old = os.umask(0o077)
    try:
        VAR.mkdir(exist_ok=True)
        VAR.chmod(0o711)
        url = sa.engine.make_url(database_url)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return
        db = Path(url.database)
        db.parent.mkdir(parents=True, exist_ok=True)
        db.touch(mode=0o600, exist_ok=True)
        # A database made by an earlier version (or by hand) may be wider.
        for path in (db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal", ".migrate-lock"))):
            with contextlib.suppress(FileNotFoundError):
                path.chmod(0o600)
    finally:
        os.umask(old)


def admin_token(configured: str | None) -> str:
    """TORCHYARD_ADMIN_TOKEN when set (the file is left alone); else the token kept in ``var/admin-token`` (0600),
    made on the first start."""
    if configured:
        return configured
    with contextlib.suppress(FileNotFoundError):
        ADMIN_TOKEN_FILE.chmod(0o600)  # one written by hand may be wider
        kept = ADMIN_TOKEN_FILE.read_text(encoding="utf-8").strip()
        if kept:
            return kept
    token = secrets.token_urlsafe(24)
    fd = os.open(ADMIN_TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    log.info("admin token made and kept in %s (set TORCHYARD_ADMIN_TOKEN to choose your own)", ADMIN_TOKEN_FILE)
    return token


def choose_redis() -> tuple[str, RedisServer | None] | None:
    """The Redis URL the children use, and the private server when the stack started one; None to give up."""
    explicit = os.environ.get("TORCHYARD_REDIS_URL")
    if explicit:
        if refuses_auth(explicit):
            log.error("the Redis at %s refuses the password in TORCHYARD_REDIS_URL (redis://:PASSWORD@host:port/0)",
                      masked(explicit))
            return None
        if not answers(explicit):
            log.error("nothing answers at TORCHYARD_REDIS_URL=%s; start that Redis, or unset the variable and the stack "
                      "starts its own", masked(explicit))
            return None
        log.info("Redis: using the Redis at %s (TORCHYARD_REDIS_URL)", masked(explicit))
        return explicit, None
    # Never whatever answers on localhost:6379: a system Redis is shared with every local user, and jobs.
    server = RedisServer(VAR / "redis", appendonly=True, password=secrets.token_urlsafe(32)).start(detach=True)
    log.info("Redis: a private redis-server at %s, data in %s (set TORCHYARD_REDIS_URL to use another)",
             masked(server.url), server.workdir)
    return server.url, server


def _probe_url(host: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _ready(url: str, redis_url: str, database_url: str, workers: dict[str, int | None]) -> bool:
    """The API answers /readyz, every worker (RQ name: pid) has registered its host and taken its first look at the
    scheduler's lease (worker/host_runner.py marks it idle then), and some process holds each of the leases (the
    scheduler, sweeps, webhooks), so the ready block comes after every start-up line."""
    try:
        if httpx.get(f"{url}/readyz", timeout=2).status_code != 200:
            return False
        with Session(get_engine(database_url)) as session:
            if not set(leader.ALL) <= leader.held(session):
                return False
        redis = Redis.from_url(redis_url, socket_connect_timeout=2, decode_responses=True)
        for name, pid in workers.items():
            pid_now, state = redis.hmget(f"rq:worker:{name}", ["pid", "state"])
            if pid_now != str(pid) or state not in ("idle", "busy"):
                return False
    except (httpx.HTTPError, RedisError, sa.exc.SQLAlchemyError):
        return False
    return True


def banner(url: str, token: str, isolation_line: str = "") -> str:
    return "\n".join([
        f"torchyard is up at {url} (dashboard: {url}/)",
        *([f"  jobs:        {isolation_line}"] if isolation_line else []),
        f"  admin token: {token}",
        f"  try:         curl -H 'Authorization: Bearer {token}' {url}/v1/jobs",
        f"  CLI:         export TORCHYARD_URL={url} TORCHYARD_API_KEY={token}",
        "  stop:        Ctrl+C",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description="Run torchyard locally: API + worker(s) + Redis.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="worker processes, each a host of its own that owns every GPU "
                                                                  "and CPU slot it finds (one is enough on one machine)")
    args = parser.parse_args(argv)

    settings = get_settings()
    # One format for the stack and its children: text on a terminal unless TORCHYARD_LOG_FORMAT says otherwise.
    log_format = settings.log_format if "TORCHYARD_LOG_FORMAT" in os.environ else "text"
    logconfig.configure("INFO", log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per /readyz probe says nothing
    set_not_dumpable()  # holds the admin token and service settings, like the API and workers it starts
    protect_var(settings.database_url)
    chosen = choose_redis()
    if chosen is None:
        return 2
    redis_url, redis = chosen
    token = admin_token(settings.admin_token)
    env = {**os.environ, "TORCHYARD_REDIS_URL": redis_url, "TORCHYARD_ADMIN_TOKEN": token, "TORCHYARD_LOG_FORMAT": log_format}
    isolation_env, isolation_line = isolation.choose(os.environ, Path(__file__).resolve().parent.parent)
    env.update(isolation_env)

    api = Child("api", [sys.executable, "-m", "api", "--host", args.host, "--port", str(args.port)], env)
    names = [f"local-{i}" for i in range(args.workers)]
    workers = [Child(f"worker {name}", [sys.executable, "-m", "worker", "--name", name], env) for name in names]
    children = [api, *workers]

    signals = 0

    def _stop(_signum: int, _frame: object) -> None:
        nonlocal signals
        signals += 1

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    url = _probe_url(args.host, args.port)
    try:
        for child in children:
            child.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not signals and not _ready(url, redis_url, settings.database_url, {n: w.pid for n, w in zip(names, workers, strict=True)}):
            dead = [c for c in children if not c.running()]
            if dead or time.monotonic() > deadline:
                # Exiting before ever answering is a configuration error (a port in use, a bad setting): restarting
                # would only repeat it.
                why = ", ".join(f"{c.name} exited with code {c.proc.returncode}" for c in dead if c.proc)
                log.error("torchyard did not start (%s); see the lines above", why or f"no answer within {READY_TIMEOUT_S:.0f} s")
                return 1
            time.sleep(0.2)
        if signals:
            return 0
        time.sleep(0.5)  # the children's lines of that moment (the probe's access line) come out first: the block is last
        log.info("%s", banner(f"http://{args.host}:{args.port}", token, isolation_line))
        while not signals:
            now = time.monotonic()
            for child in children:
                child.tend(now)
            time.sleep(0.2)
        log.info("stopping: the worker(s) requeue their jobs, then the API and Redis stop (Ctrl+C again to kill)")
        return 0
    finally:
        # A worker's job gets TORCHYARD_STOP_GRACE_S to checkpoint before its ranks are killed; then the worker requeues it.
        stop_all(children, grace_s=settings.stop_grace_s + 30, forced=lambda: signals > 1)
        if redis:
            redis.stop()


if __name__ == "__main__":
    sys.exit(main())
