"""``python -m bench.executor_startup``: POST -> first step through the real service, per executor.

Two stacks on this machine, each a private redis-server, an API and one worker on its own SQLite
database: one worker with ``TORCHYARD_EXECUTOR=local`` (torchrun spawned by the worker), one with
``TORCHYARD_EXECUTOR=slurm`` against a private single-host Slurm (stack/slurm_cluster.py). The same
2-rank tiny MLP (gloo, CPU) is POSTed to each, alternating, ``--rounds`` times each, one job at a
time. Measured from the POST to the wall time the trainer stamped on its first metric event, split
into POST -> running (the worker claimed it: dequeue, claim, spec.json) and running -> first step
(the executor's start and torch's: interpreter, imports, rendezvous, data); for Slurm also POST ->
the job's StartTime (when slurmd ran the batch script, one-second resolution). Prints a table and
writes bench/results/executor-startup.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import REPO, Stack, bench_env, database
from stack import slurm_cluster
from stack.slurm_cluster import SlurmCluster

log = logging.getLogger("bench")

SPEC: dict[str, Any] = {
    "name": "startup",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 128, "eval_samples": 32, "features": 8, "classes": 3}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2, "device": "cpu"},
    "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 1},
    "checkpoint": {"every_steps": 100},
}
TERMINAL = {"succeeded", "failed", "cancelled"}


def _first_step_time(run_dir: Path, deadline: float) -> float:
    path = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for line in path.read_text(encoding="utf-8").splitlines():
                event = json.loads(line)
                if event["type"] == "metric":
                    return float(event["time"])
        time.sleep(0.05)
    raise TimeoutError(f"no step in {path}")


def _iso(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _one(client: httpx.Client, cluster: SlurmCluster | None, timeout_s: float = 300) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    posted = time.time()
    created = client.post("/v1/jobs", json=SPEC)
    created.raise_for_status()
    job_id = created.json()["id"]
    job = created.json()
    while job["status"] == "queued" and time.monotonic() < deadline:
        time.sleep(0.05)
        job = client.get(f"/v1/jobs/{job_id}").json()
    first = _first_step_time(Path(job["run_dir"]), deadline)
    while job["status"] not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
        job = client.get(f"/v1/jobs/{job_id}").json()
    if job["status"] != "succeeded":
        raise RuntimeError(f"job {job_id} ended {job['status']}: {job['error']}")
    running = min(_iso(t["at"]) for t in job["transitions"] if t["to_status"] == "running")
    row = {"first_step_s": first - posted, "post_to_running_s": running - posted, "running_to_first_step_s": first - running}
    if cluster is not None and job["executor_id"]:
        record = cluster.command("scontrol", "show", "job", "-o", job["executor_id"], check=False)
        started = next((f.split("=", 1)[1] for f in record.split() if f.startswith("StartTime=")), "")
        if started[:1].isdigit():
            row["slurm_start_s"] = time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S")) - posted
    return row


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.executor_startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    reason = slurm_cluster.missing()
    if reason:
        log.error("%s", reason)
        return 2
    work = Path(tempfile.mkdtemp(prefix="torchyard-bench-executors-"))
    rows: dict[str, list[dict[str, float]]] = {"local": [], "slurm": []}
    quiet = {k: v for k, v in bench_env().items() if k in ("OMP_NUM_THREADS", "TORCHYARD_LOG_LEVEL")}
    slurm_env = {"TORCHYARD_SLURM_PARTITION": "batch", "TORCHYARD_SLURM_CPUS_PER_RANK": "1", "TORCHYARD_SLURM_GPUS": "false",
                 # The supervisor's poll of Slurm: a finer one would only shave the end of a job, not its start.
                 "TORCHYARD_SLURM_POLL_INTERVAL_S": "1"}
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(SlurmCluster(work / "slurm"))
        stacks = {
            "local": stack.enter_context(Stack(work / "local", stack.enter_context(database("sqlite", work)), **quiet)),
            "slurm": stack.enter_context(Stack(work / "slurm-stack", stack.enter_context(database("sqlite", work)), **quiet,
                                               TORCHYARD_EXECUTOR="slurm", TORCHYARD_SLURM_CONF=str(cluster.conf), **slurm_env)),
        }
        clients = {name: stack.enter_context(httpx.Client(base_url=s.url, headers=s.services.headers, timeout=30))
                   for name, s in stacks.items()}
        for i in range(args.rounds):
            for name in ("local", "slurm") if i % 2 == 0 else ("slurm", "local"):
                rows[name].append(_one(clients[name], cluster if name == "slurm" else None))
                log.info("round %d %s: %s", i + 1, name, {k: round(v, 2) for k, v in rows[name][-1].items()})
    summary = {name: {key: _stats([r[key] for r in runs if key in r]) for key in runs[0]} for name, runs in rows.items()}
    sys.stdout.write(f"{'executor':<8} {'POST -> first step (s)':<24} {'POST -> running':<16} {'running -> step':<16} "
                     f"{'POST -> Slurm StartTime':<24}\n")
    for name, stats in summary.items():
        first = stats["first_step_s"]
        start = f"{stats['slurm_start_s']['median']:.2f}" if "slurm_start_s" in stats else "-"
        sys.stdout.write(f"{name:<8} {first['median']:>6.2f} [{first['min']:.2f}-{first['max']:.2f}]{'':<7} "
                         f"{stats['post_to_running_s']['median']:<16.2f} {stats['running_to_first_step_s']['median']:<16.2f} "
                         f"{start:<24}\n")
    out = REPO / "bench" / "results" / "executor-startup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": rows, "summary": summary, "spec": SPEC}, indent=2), encoding="utf-8")
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
