"""Shared pieces of the benchmarks: the machine, launches, statistics, databases, services."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import resource
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("bench")

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("TORCHYARD_BENCH_PG", "postgresql://127.0.0.1:5432/test")
TOKEN = "bench-admin-token"


@dataclass
class Ctx:
    """What every suite gets: where to put files, how long to run, and a place for results."""

    work: Path
    quick: bool
    results: dict[str, Any] = field(default_factory=dict)


def bench_parser(module: str, doc: str | None, rounds: int) -> argparse.ArgumentParser:
    """The arguments every single-purpose bench takes: ``--rounds`` and ``--out`` (bench/results/<module>.json);
    its INFO log goes to stdout, the table with it."""
    name = module.rsplit(".", 1)[-1]
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"{name.replace('_', '-')}.json")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    return parser


def write_results(out: Path, results: dict[str, Any]) -> None:
    """``results`` as JSON at ``out``, said in the log."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    log.info("wrote %s", out)


# ------------------------------------------------------------------ machine


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    mem = 0
    with contextlib.suppress(OSError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(), "cpu": cpu, "mem_gib": round(mem / 2**30, 1), "gpu": gpu,
        "torch": torch.__version__, "python": platform.python_version(), "load_avg_start": list(os.getloadavg()),
    }


# ------------------------------------------------------------------ statistics


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def window_rate(times: dict[int, float], start_step: int, per_step: float) -> tuple[float, float]:
    """(units per second, seconds per step) between the first logged step at or after ``start_step``
    and the last logged step: wall-clock between two host-synced points, so it counts everything."""
    steps = sorted(s for s in times if s >= start_step)
    if len(steps) < 2:
        raise ValueError(f"fewer than two logged steps after step {start_step}: {sorted(times)}")
    s0, s1 = steps[0], steps[-1]
    dt = times[s1] - times[s0]
    return (s1 - s0) * per_step / dt, dt / (s1 - s0)


# ------------------------------------------------------------------ processes


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children that have ended and been waited for, so far: the
    difference across a run is what that run's processes used."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_env(**extra: str) -> dict[str, str]:
    """One thread per rank (two ranks share two cores), torchyard's code importable, settings clean."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TORCHYARD_LOG_LEVEL": "WARNING"})
    env.update(extra)
    return env


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


class Periodic:
    """A context manager that calls ``sample()`` on a thread of its own every ``interval_s`` while the block runs,
    and once more as it ends."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Periodic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> None:
        raise NotImplementedError


class PeakRSS(Periodic):
    """Samples the peak resident memory (VmHWM, the kernel's high-water mark) of every descendant of a
    process while it runs, so ranks' peaks are read without changing the code that runs in them."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        super().__init__(interval_s)
        self.pid = pid
        self.peaks: dict[int, int] = {}

    def sample(self) -> None:
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(OSError, ValueError):
                    for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peaks[child.pid] = max(self.peaks.get(child.pid, 0), int(line.split()[1]) * 1024)


def run_logged(cmd: list[str], log_path: Path, env: dict[str, str], timeout_s: float, cwd: Path = REPO,
               sample_rss: bool = False, check: bool = True) -> tuple[float, dict[int, int], int]:
    """Run ``cmd`` to completion; returns (wall time at launch, peak RSS per descendant pid, exit code).
    Raises on a non-zero exit unless ``check`` is false (the caller then judges the run by its output)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as out:
        launched = time.time()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        sampler = PeakRSS(proc.pid) if sample_rss else contextlib.nullcontext()
        with sampler:
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{cmd[:6]} timed out after {timeout_s}s; see {log_path}") from None
    if code != 0 and check:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:8])} exited {code}; see {log_path}:\n{tail}")
    if code != 0:
        log.warning("%s exited %d; see %s", " ".join(cmd[:8]), code, log_path)
    return launched, (sampler.peaks if isinstance(sampler, PeakRSS) else {}), code


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def metric_times(events: list[dict[str, Any]], name: str = "train/loss") -> dict[int, float]:
    """step -> wall time of the metric event that reported it (written right after the step's host sync)."""
    return {e["step"]: e["time"] for e in events if e.get("type") == "metric" and name in (e.get("values") or {})}


# ------------------------------------------------------------------ databases


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=2):
            return True
    except Exception:  # noqa: BLE001 - any failure means "no PostgreSQL here"; the suite says so and skips it
        return False


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database of our own (dropped afterwards); yields its SQLAlchemy URL."""
    import psycopg

    name = f"torchyard_bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"postgresql+psycopg://{base.split('://', 1)[1]}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def database(kind: str, work: Path) -> Iterator[str]:
    """A migrated, empty torchyard database: ``sqlite`` (a file under ``work``) or ``postgresql``."""
    from jobs.store.db import init_db, make_engine

    if kind == "sqlite":
        path = work / f"bench-{secrets.token_hex(3)}.db"
        url = f"sqlite:///{path}"
        engine = make_engine(url)
        init_db(engine)
        engine.dispose()
        yield url
        return
    with pg_database() as url:
        engine = make_engine(url)
        init_db(engine)
        engine.dispose()
        yield url


# ------------------------------------------------------------------ services


class Stack:
    """A private redis-server, one API process and optionally one worker, all on ``database_url``."""

    def __init__(self, work: Path, database_url: str, workers: int = 1, poll_interval_s: float = 0.5, **env: str):
        self.work, self.database_url, self.n_workers, self.poll_interval_s, self.env = work, database_url, workers, poll_interval_s, env

    def __enter__(self) -> Stack:
        from jobs.settings import Settings
        from stack.redis_server import RedisServer
        from tests.helpers import Services

        self.redis = RedisServer(self.work / "redis").start()
        self.settings = Settings(
            database_url=self.database_url, redis_url=self.redis.url, runs_dir=self.work / "runs",
            data_dir=self.work / "data", code_dir=self.work / "code", admin_token=TOKEN,
            poll_interval_s=self.poll_interval_s, max_nproc_per_node=max(2, os.cpu_count() or 1),
        )
        for d in ("runs", "data", "code"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        self.services = Services(self.settings, self.work / "logs")
        try:
            # Benchmarks submit thousands of jobs; the per-owner queued cap would answer 429.
            extra = {"TORCHYARD_MAX_QUEUED_PER_OWNER": "100000000", "TORCHYARD_MAX_RUNNING_PER_OWNER": "1000", **self.env}
            self.services.start_api(timeout_s=60, **extra)
            for _ in range(self.n_workers):
                self.services.start_worker(**extra)
            if self.n_workers:
                from redis import Redis
                from rq import Worker

                from tests.helpers import wait_until

                conn = Redis.from_url(self.redis.url)
                wait_until(lambda: Worker.count(connection=conn) >= self.n_workers, 60, what="the workers")
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def url(self) -> str:
        return self.services.url

    def __exit__(self, *exc: object) -> None:
        self.services.stop()
        self.redis.stop()
