"""``python -m worker [--queue Q]``: the worker of one host. It owns the host's GPUs and CPU slots (registered and
heart-beaten in SQL), runs every node task the scheduler places on it, and takes its turn as the scheduler and
the reconciler (whichever worker holds the leader lease places jobs)."""

from __future__ import annotations

import argparse
import os
import shutil
import socket

from sqlmodel import Session

from jobs.infra import logconfig
from jobs.infra.queue import redis_client
from jobs.lifecycle.reconciler import ReconcilerLoop
from jobs.scheduling.scheduler import SchedulerLoop
from jobs.settings import get_settings
from jobs.storage import store
from jobs.store.db import get_engine, init_db
from jobs.sweeps.controller import SweepLoop
from jobspec.pdeathsig import set_not_dumpable
from worker import mlflow_runs
from worker.health import HealthCheck
from worker.host import HostHeartbeat, inventory
from worker.host_runner import HostRunner
from worker.sandbox.isolation import on_worker_start
from worker.sandbox.leftovers import LeftoverSweep

# What the Slurm executor runs (worker/executors/slurm.py); sacct is optional.
SLURM_COMMANDS = ("sbatch", "scontrol", "scancel")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker", description="Run the torchyard jobs placed on this host.")
    parser.add_argument("--queue", action="append", help="queue to serve (repeatable); default TORCHYARD_WORKER_QUEUES")
    parser.add_argument("--name", help="host id; default TORCHYARD_WORKER_ID or host:pid")
    parser.add_argument("--burst", action="store_true", help="exit when no task is waiting or running")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    settings = get_settings()
    logconfig.configure(args.log_level, settings.log_format)  # one format with the API's (TORCHYARD_LOG_FORMAT)
    if settings.executor == "slurm":
        absent = [name for name in SLURM_COMMANDS
                  if shutil.which(name if settings.slurm_bin_dir is None else str(settings.slurm_bin_dir / name)) is None]
        if absent:
            # Every job this worker took would fail at sbatch: refuse to take any.
            parser.error(f"TORCHYARD_EXECUTOR=slurm, but {', '.join(absent)} not found "
                         f"({'TORCHYARD_SLURM_BIN_DIR' if settings.slurm_bin_dir else 'PATH'})")
    # Jobs run as this process's user: keep its environment (database URL, secrets key) and memory from them.
    set_not_dumpable()
    name = args.name or settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    # Each node task is a forked child (worker/host_runner.py) that reads its host id from this environment.
    os.environ["TORCHYARD_WORKER_ID"] = settings.worker_id = name
    init_db(get_engine(settings.database_url))
    if settings.mlflow_tracking_uri:
        mlflow_runs.preload()
    if settings.storage_url:
        store.preload()
    with Session(get_engine(settings.database_url)) as session:
        mode = on_worker_start(settings, session, name)
    if mode.uids is None:
        # Jobs run as this user: what an attempt that ended left running is found by its marks, not its uid.
        leftovers = LeftoverSweep(settings, interval_s=settings.lease_ttl_s)
        leftovers.step()
        leftovers.start()
    ReconcilerLoop(settings, interval_s=max(1.0, settings.lease_ttl_s / 2)).start()
    queues = args.queue or settings.worker_queues
    host = HostHeartbeat(settings, inventory(settings.model_copy(update={"worker_queues": queues}), name))
    host.register()
    host.start()
    health = HealthCheck(settings, name) if settings.host_health_cmd else None
    if health is not None:
        health.start()
    redis = redis_client(settings.redis_url)
    scheduler = SchedulerLoop(settings, holder=name, redis=redis)
    scheduler.step()
    scheduler.start()
    sweeps = SweepLoop(settings, holder=name, redis=redis)  # sweeps' trials, under a lease of their own
    sweeps.start()

    def leave() -> None:
        if health is not None:
            health.stop()
        scheduler.stop()
        sweeps.stop()
        host.stop()

    try:
        HostRunner(name, redis, on_stopping=leave).run(burst=args.burst)
    finally:
        leave()


if __name__ == "__main__":
    main()
