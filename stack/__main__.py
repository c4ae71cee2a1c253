"""``python -m stack``: run the whole service locally on the CPU.

Starts the API and worker(s) with SQLite under ./var, and a private redis-server when
none answers at TORCHYARD_REDIS_URL. Prints the admin token to use with curl.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs.settings import get_settings
from stack.redis_server import RedisServer, answers, masked, refuses_auth
from trainer.pdeathsig import set_not_dumpable

log = logging.getLogger("torchyard")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description="Run torchyard locally: API + worker(s) + Redis.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="worker processes (each runs one job at a time)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    settings = get_settings()
    set_not_dumpable()  # holds the admin token and service settings, like the API and workers it starts
    env = dict(os.environ)
    redis: RedisServer | None = None
    if refuses_auth(settings.redis_url):
        # A Redis is there: starting a private one instead would split the queues between two servers.
        log.error("the Redis at %s refuses the password in TORCHYARD_REDIS_URL (redis://:PASSWORD@host:port/0)",
                  masked(settings.redis_url))
        return 2
    if not answers(settings.redis_url):
        redis = RedisServer(Path("var/redis"), appendonly=True).start()
        env["TORCHYARD_REDIS_URL"] = redis.url
        log.info("no Redis at %s; started a private redis-server at %s", masked(settings.redis_url), redis.url)
    else:
        log.info("using the Redis at %s", masked(settings.redis_url))
    token = settings.admin_token or secrets.token_urlsafe(24)
    env["TORCHYARD_ADMIN_TOKEN"] = token

    children = [subprocess.Popen([sys.executable, "-m", "api", "--host", args.host, "--port", str(args.port)], env=env)]
    for i in range(args.workers):
        children.append(subprocess.Popen([sys.executable, "-m", "worker", "--name", f"local-{i}"], env=env))

    log.info("torchyard is up at http://%s:%d", args.host, args.port)
    log.info("admin token: %s", token)
    log.info("try: curl -H 'Authorization: Bearer %s' http://%s:%d/v1/jobs", token, args.host, args.port)

    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping and all(c.poll() is None for c in children):
            time.sleep(0.5)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
        if redis:
            redis.stop()
    return 0 if stopping else 1


if __name__ == "__main__":
    sys.exit(main())
