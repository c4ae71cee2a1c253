"""(4) API: requests/s and p50/p99 of ``GET /v1/jobs/{id}`` and ``POST /v1/jobs`` with 50 concurrent clients
against one API process, on SQLite and on PostgreSQL, with 10,000 jobs and 1,000,000 metric points loaded.

The tables are filled with bulk SQL (executemany on SQLite, COPY on PostgreSQL), not through the API.
The load generator (bench/loadgen.py) is a separate process; no worker runs, so POSTed jobs stay queued.
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from bench.common import REPO, TOKEN, Ctx, Stack, bench_env, database, pg_available
from bench.dispatch import tiny_spec

log = logging.getLogger("bench.api")

OWNER = "admin"  # the admin token's owner (api/auth.py)
METRIC_NAMES = ["train/loss", "train/lr", "train/samples_per_s", "train/step_time_s", "train/grad_norm"]


def populate(url: str, jobs: int, points: int) -> list[str]:
    """``jobs`` finished jobs (with their transitions and attempts) and ``points`` metric points; returns the ids."""
    engine = sa.create_engine(url)
    spec = json.dumps({**tiny_spec("bench-loaded"), "kind": "catalog"})
    base = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(days=30)
    ids, job_rows, transitions, attempts = [], [], [], []
    for i in range(jobs):
        created = base + timedelta(seconds=i)
        job_id = f"{int(created.timestamp() * 1000):012x}{secrets.token_hex(6)}"
        ids.append(job_id)
        status = "succeeded" if i % 10 else ("failed" if i % 20 else "cancelled")
        job_rows.append((job_id, OWNER, f"job-{i % 100}", "catalog", status, "default", spec, "{}", 1, 1, created, created, created,
                         created + timedelta(minutes=5), 0, 20, json.dumps({"train/loss": 0.5})))
        transitions.append((job_id, created, "queued", "running", 1, "started"))
        transitions.append((job_id, created + timedelta(minutes=5), "running", status, 1, "done"))
        attempts.append((job_id, 1, "bench", created, created + timedelta(minutes=5), status))
    per_job = max(1, points // jobs)
    steps = -(-per_job // len(METRIC_NAMES))
    job_cols = ("id, owner, name, kind, status, queue, spec, labels, attempt, max_attempts, created_at, updated_at, started_at, "
                "finished_at, last_seq, last_step, latest_metrics")
    metric_cols = "job_id, name, step, epoch, value, time, seq"

    def metric_rows():
        n = 0
        for job_id in ids:
            for step in range(1, steps + 1):
                for name in METRIC_NAMES:
                    if n == points:
                        return
                    n += 1
                    yield (job_id, name, step, 0, 1.0 / step, 1.7e9 + step, step)

    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if engine.dialect.name == "postgresql":
            for table, cols, rows in (("jobs", job_cols, job_rows),
                                      ("job_transitions", "job_id, at, from_status, to_status, attempt, reason", transitions),
                                      ("job_attempts", "job_id, attempt, worker_id, started_at, finished_at, outcome", attempts),
                                      ("job_metrics", metric_cols, metric_rows())):
                with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
        else:
            def q(cols: str) -> str:
                return ", ".join("?" for _ in cols.split(","))

            fmt = [tuple(v.isoformat(sep=" ") if isinstance(v, datetime) else v for v in r) for r in job_rows]
            cur.executemany(f"INSERT INTO jobs ({job_cols}) VALUES ({q(job_cols)})", fmt)
            cur.executemany("INSERT INTO job_transitions (job_id, at, from_status, to_status, attempt, reason) VALUES (?, ?, ?, ?, ?, ?)",
                            [(r[0], r[1].isoformat(sep=" "), *r[2:]) for r in transitions])
            cur.executemany("INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, finished_at, outcome) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            [(r[0], r[1], r[2], r[3].isoformat(sep=" "), r[4].isoformat(sep=" "), r[5]) for r in attempts])
            cur.executemany(f"INSERT INTO job_metrics ({metric_cols}) VALUES ({q(metric_cols)})", metric_rows())
        raw.commit()
    finally:
        raw.close()
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE"))  # fresh statistics, as a long-running database would have
        counts = {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in ("jobs", "job_metrics")}
    engine.dispose()
    log.info("loaded %s", counts)
    return ids


def _load(url: str, mode: str, ids_file: str, duration: float, warmup: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.loadgen", "--url", url, "--token", TOKEN, "--mode", mode, "--ids-file", ids_file,
           "--body", json.dumps(tiny_spec("bench-post")), "--concurrency", "50", "--duration", str(duration), "--warmup", str(warmup)]
    out = subprocess.run(cmd, env=bench_env(), cwd=REPO, capture_output=True, text=True, timeout=duration + warmup + 120)
    if out.returncode != 0:
        raise RuntimeError(f"loadgen failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def api(ctx: Ctx) -> dict[str, Any]:
    jobs, points = 10_000, 1_000_000
    duration, warmup = (4.0, 1.0) if ctx.quick else (8.0, 2.0)
    kinds = ["sqlite"] + (["postgresql"] if pg_available() else [])
    results: dict[str, Any] = {}
    for kind in kinds:
        with database(kind, ctx.work) as url:
            started = time.perf_counter()
            ids = populate(url, jobs, points)
            load_s = time.perf_counter() - started
            ids_file = ctx.work / f"ids-{kind}.txt"
            ids_file.write_text("\n".join(ids))
            with Stack(ctx.work / f"stack-api-{kind}", url, workers=0) as stack:
                get = _load(stack.url, "get", str(ids_file), duration, warmup)
                post = _load(stack.url, "post", str(ids_file), duration, warmup)
            results[kind] = {"populate_s": load_s, "get": get, "post": post}
            log.info("%s: GET %.0f req/s p50 %.1fms p99 %.1fms | POST %.0f req/s p50 %.1fms p99 %.1fms (loaded in %.1fs)", kind,
                     get["rps"], get["p50_ms"], get["p99_ms"], post["rps"], post["p50_ms"], post["p99_ms"], load_s)
    ratios = {}
    if "postgresql" in results:
        ratios = {f"postgresql/sqlite {m} rps": results["postgresql"][m]["rps"] / results["sqlite"][m]["rps"] for m in ("get", "post")}
    return {"config": {"jobs": jobs, "metric_points": points, "concurrency": 50, "duration_s": duration, "warmup_s": warmup,
                       "api_processes": 1, "loadgen": "bench/loadgen.py (httpx + asyncio, separate process)"},
            "results": results, "ratios": ratios}
