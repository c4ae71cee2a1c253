"""``python -m worker [--queue Q]``: an RQ worker that runs torchyard jobs."""

from __future__ import annotations

import argparse
import logging
import os
import socket

from rq import Worker

from jobs.db import get_engine, init_db
from jobs.queue import redis_client
from jobs.settings import get_settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker", description="Run torchyard jobs from Redis queues.")
    parser.add_argument("--queue", action="append", help="queue to serve (repeatable); default TORCHYARD_WORKER_QUEUES")
    parser.add_argument("--name", help="worker id; default TORCHYARD_WORKER_ID or host:pid")
    parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    settings = get_settings()
    # RQ forks a work horse per job; it inherits this settings object and so reports the worker's id, not its own pid.
    settings.worker_id = args.name or settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    name = settings.worker_id
    init_db(get_engine(settings.database_url))
    queues = args.queue or settings.worker_queues
    worker = Worker(queues, connection=redis_client(settings.redis_url), name=name)
    worker.work(burst=args.burst, logging_level=args.log_level.upper(), with_scheduler=False)


if __name__ == "__main__":
    main()
