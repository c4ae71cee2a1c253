"""``python -m bench.executor_startup``: how long an attempt takes to reach its first step, per executor.

The same 2-rank tiny MLP (gloo, CPU) is started through the local executor (torchrun spawned here)
and through the Slurm executor (sbatch to a private single-host Slurm, stack/slurm_cluster.py),
alternating, ``--rounds`` times each. Measured from the executor's start() call to the wall time
the trainer stamped on its first metric event; for Slurm also to the job's StartTime (when Slurm
ran the batch script). Prints a table and writes bench/results/executor-startup.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import REPO
from jobs.settings import Settings
from stack import slurm_cluster
from stack.slurm_cluster import SlurmCluster
from trainer.spec import parse_spec
from worker.executors.base import Executor, LaunchRequest
from worker.executors.local import LocalExecutor
from worker.executors.slurm import SlurmExecutor

log = logging.getLogger("bench")

SPEC: dict[str, Any] = {
    "name": "startup",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 128, "eval_samples": 32, "features": 8, "classes": 3}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2, "device": "cpu"},
    "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 1},
    "checkpoint": {"every_steps": 100},
}


def _first_step_time(run_dir: Path, timeout_s: float = 300) -> float:
    deadline = time.monotonic() + timeout_s
    path = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                event = json.loads(line)
                if event["type"] == "metric":
                    return float(event["time"])
        time.sleep(0.05)
    raise TimeoutError(f"no step in {path}")


def _one(executor: Executor, settings: Settings) -> dict[str, float]:
    job_id = uuid.uuid4().hex[:16]
    run_dir = (settings.runs_dir / job_id).resolve()
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(SPEC), encoding="utf-8")
    request = LaunchRequest(job_id=job_id, attempt=1, run_dir=run_dir, spec=parse_spec(SPEC))
    wall = time.time()
    launch = executor.start(request)
    first = _first_step_time(run_dir)
    row = {"first_step_s": first - wall}
    if isinstance(executor, SlurmExecutor):
        record = executor._run([executor._bin("scontrol"), "show", "job", "-o", str(launch.executor_id)]).stdout
        started = next((f.split("=", 1)[1] for f in record.split() if f.startswith("StartTime=")), "")
        if started[:1].isdigit():
            row["slurm_start_s"] = time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S")) - wall
    while not executor.poll(launch).ended:
        time.sleep(0.2)
    executor.release(launch)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.executor_startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    reason = slurm_cluster.missing()
    if reason:
        log.error("%s", reason)
        return 2
    # Both executors' ranks inherit this worker's environment: one thread each, as in the tests.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="torchyard-bench-executors-"))
    rows: dict[str, list[dict[str, float]]] = {"local": [], "slurm": []}
    with SlurmCluster(work / "slurm") as cluster:
        common: dict[str, Any] = {"database_url": "sqlite://", "runs_dir": work / "runs", "data_dir": work / "data", "code_dir": work}
        local = LocalExecutor(Settings(**common))
        slurm = SlurmExecutor(Settings(**common, executor="slurm", slurm_conf=cluster.conf, slurm_cpus_per_rank=1, slurm_gpus=False,
                                       slurm_poll_interval_s=0.5))
        for i in range(args.rounds):
            for name, executor in (("local", local), ("slurm", slurm)) if i % 2 == 0 else (("slurm", slurm), ("local", local)):
                rows[name].append(_one(executor, executor.settings))
                log.info("round %d %s: %s", i + 1, name, {k: round(v, 2) for k, v in rows[name][-1].items()})
    summary = {name: {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                            "max": max(r[key] for r in runs)} for key in runs[0]} for name, runs in rows.items()}
    sys.stdout.write(f"{'executor':<8} {'start -> first step (s), median [min-max]':<44} {'sbatch -> Slurm StartTime (s)':<30}\n")
    for name, stats in summary.items():
        first = stats["first_step_s"]
        start = f"{stats['slurm_start_s']['median']:.2f}" if "slurm_start_s" in stats else "-"
        sys.stdout.write(f"{name:<8} {first['median']:>6.2f} [{first['min']:.2f}-{first['max']:.2f}]{'':<26} {start:<30}\n")
    out = REPO / "bench" / "results" / "executor-startup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": rows, "summary": summary, "spec": SPEC}, indent=2), encoding="utf-8")
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
