"""(8) The read path against its framework's ceiling: ``GET /v1/jobs/{id}`` (32 connections) and ``POST /v1/jobs``
(50 connections, one owner) on one ``python -m api`` process, against a bare FastAPI app (bench/bare_app.py) that
answers a fixed body of the same size, measured side by side in one run with ``wrk`` on SQLite and PostgreSQL with
10,000 jobs and 1,000,000 metric points loaded. Only the ratios mean anything on a shared machine: both servers
are measured in alternation, several rounds, and the ratio of the medians is reported.

    python -m bench --only read_path
    python -m bench.read_path --profile /tmp/prof   # also py-spy records the API under GET load (pip install py-spy)
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import wrk_load
from bench.api_bench import populate
from bench.common import REPO, TOKEN, Ctx, Stack, bench_env, database, pg_available
from bench.dispatch import tiny_spec

log = logging.getLogger("bench.read_path")
GET_CONNECTIONS, POST_CONNECTIONS = 32, 50
GOAL_GET, GOAL_POST, GOAL_P99_MS = 0.40, 0.25, 100.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BareApp:
    def __init__(self, body_file: Path, log_file: Path):
        self.body_file, self.log_file, self.port = body_file, log_file, _free_port()

    def __enter__(self) -> BareApp:
        self.log = self.log_file.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.bare_app", "--port", str(self.port)], cwd=REPO,
                                     env=bench_env(BARE_BODY=str(self.body_file)), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/jobs/x", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"the bare app did not answer; see {self.log_file}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def _profile(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy")
    if spy is None:
        log.warning("py-spy is not installed (pip install -e '.[dev]'); no profile")
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw",
                             "--output", str(out), "--nonblocking", "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(kind: str, work: Path, *, jobs: int, points: int, duration_s: float, rounds: int,
            profile_dir: Path | None = None, post: bool = True, api_env: dict[str, str] | None = None) -> dict[str, Any]:
    with database(kind, work) as url:
        started = time.perf_counter()
        ids = populate(url, jobs, points)
        load_s = time.perf_counter() - started
        ids_file = work / f"read-ids-{kind}.txt"
        ids_file.write_text("\n".join(ids) + "\n")
        post_file = work / "post-body.json"
        post_file.write_text(json.dumps(tiny_spec("bench-post")))
        with Stack(work / f"stack-read-{kind}", url, workers=0, **(api_env or {})) as stack:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            sample = httpx.get(f"{stack.url}/v1/jobs/{ids[0]}", headers=headers, timeout=30)
            sample.raise_for_status()
            body_file = work / f"bare-body-{kind}.json"
            body_file.write_bytes(sample.content)
            with BareApp(body_file, work / f"bare-{kind}.log") as bare:
                runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ("get", "bare_get", "post", "bare_post")}
                spy = None
                for i in range(rounds):
                    for name, base in (("bare_get", bare.url), ("get", stack.url)):
                        if name == "get" and profile_dir is not None and i == 0:
                            spy = _profile(stack.services.api.pid, profile_dir / f"get-{kind}.txt", duration_s)
                        runs[name].append(wrk_load.run(base, method="GET", path="/v1/jobs/%s", token=TOKEN, ids_file=ids_file,
                                                       connections=GET_CONNECTIONS, duration_s=duration_s))
                    for name, base in (("bare_post", bare.url), ("post", stack.url)) if post else ():
                        runs[name].append(wrk_load.run(base, method="POST", path="/v1/jobs", token=TOKEN, body_file=post_file,
                                                       connections=POST_CONNECTIONS, duration_s=duration_s))
                if spy is not None:
                    spy.wait(timeout=120)
    med = {name: {m: statistics.median(r[m] for r in rs) for m in ("rps", "p50_ms", "p99_ms")} | {
        "non2xx": sum(r["non2xx"] for r in rs), "socket_errors": sum(r["socket_errors"] for r in rs)} for name, rs in runs.items() if rs}
    if not post:
        ratio = med["get"]["rps"] / med["bare_get"]["rps"]
        log.info("%s: GET %.0f req/s p99 %.1f ms vs bare %.0f (%.2fx)", kind, med["get"]["rps"], med["get"]["p99_ms"],
                 med["bare_get"]["rps"], ratio)
        return {"body_bytes": len(sample.content), "median": med, "ratios": {"get": ratio}, "runs": runs}
    ratios = {"get": med["get"]["rps"] / med["bare_get"]["rps"], "post": med["post"]["rps"] / med["bare_post"]["rps"]}
    log.info("%s: GET %.0f req/s p99 %.1f ms vs bare %.0f (%.2fx) | POST %.0f req/s p99 %.1f ms vs bare %.0f (%.2fx)", kind,
             med["get"]["rps"], med["get"]["p99_ms"], med["bare_get"]["rps"], ratios["get"],
             med["post"]["rps"], med["post"]["p99_ms"], med["bare_post"]["rps"], ratios["post"])
    return {"populate_s": load_s, "body_bytes": len(sample.content), "median": med, "ratios": ratios, "runs": runs,
            "goals_met": {"get_ratio": ratios["get"] >= GOAL_GET, "get_p99": med["get"]["p99_ms"] <= GOAL_P99_MS,
                          "post_ratio": ratios["post"] >= GOAL_POST}}


def read_path(ctx: Ctx, profile_dir: Path | None = None) -> dict[str, Any]:
    jobs, points = 10_000, 1_000_000
    duration_s, rounds = (4.0, 2) if ctx.quick else (8.0, 3)
    kinds = ["sqlite"] + (["postgresql"] if pg_available() else [])
    results = {kind: measure(kind, ctx.work, jobs=jobs, points=points, duration_s=duration_s, rounds=rounds, profile_dir=profile_dir)
               for kind in kinds}
    return {"config": {"jobs": jobs, "metric_points": points, "get_connections": GET_CONNECTIONS, "post_connections": POST_CONNECTIONS,
                       "duration_s": duration_s, "rounds": rounds, "api_processes": 1, "loadgen": "wrk -t1",
                       "goals": {"get_ratio": GOAL_GET, "get_p99_ms": GOAL_P99_MS, "post_ratio": GOAL_POST}},
            "results": results}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.read_path", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", type=Path, help="a folder for py-spy's raw profiles of the API under GET load")
    ap.add_argument("--only-db", choices=["sqlite", "postgresql"])
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--get-only", action="store_true", help="measure GET alone (no POST rounds)")
    ap.add_argument("--rounds", type=int, help="rounds of each measurement (default 3, --quick 2)")
    ap.add_argument("--api-env", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for the API process, e.g. TORCHYARD_READ_THREADS=8 (repeat for several)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="torchyard-read-"))
    try:
        kinds = [args.only_db] if args.only_db else ["sqlite"] + (["postgresql"] if pg_available() else [])
        duration_s, rounds = (4.0, 2) if args.quick else (8.0, 3)
        out = {k: measure(k, work, jobs=10_000, points=args.points, duration_s=duration_s, rounds=args.rounds or rounds,
                          profile_dir=args.profile, post=not args.get_only, api_env=dict(e.split("=", 1) for e in args.api_env))
               for k in kinds}
        print(json.dumps({k: {"median": v["median"], "ratios": v["ratios"]} for k, v in out.items()}, indent=1))  # noqa: T201 - CLI output
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
