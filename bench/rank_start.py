"""``python -m bench.rank_start``: how long torchrun takes to give each rank a process group, and at what CPU
cost, when it starts the ranks as it does for every job today (a fresh interpreter per rank that imports torch)
against forking them from the launcher, which has imported torch already (``--run-path --start-method=fork``).

Each launch runs a probe that imports torch, joins a gloo process group and records when that was done,
measured from just before the launch. Launches alternate between the two ways, ``--rounds`` times each, one at
a time, at 1 and 2 ranks. CPU is what the launch and every process under it used (``RUSAGE_CHILDREN``). Prints a
table and writes bench/results/rank-start.json.

This measures the direction only: the trainer and the script bootstrap exit through ``os._exit`` and set up
their output before torch is imported, which a forked rank would have to do otherwise (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import bench_env, bench_parser, children_cpu_s, machine, torchrun, write_results

log = logging.getLogger("bench")

PROBE = '''
import json, os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
ready = time.time()
with open(os.path.join(os.environ["PROBE_OUT"], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"rank": dist.get_rank(), "ready_s": ready - float(os.environ["LAUNCHED_AT"])}, f)
dist.barrier()
dist.destroy_process_group()
'''
WAYS: dict[str, list[str]] = {"exec": [], "fork": ["--run-path", "--start-method=fork"]}


def launch(way: str, nproc: int, work: Path) -> dict[str, Any]:
    """One launch: when the slowest rank had its process group, the launch's wall time and CPU."""
    out = Path(tempfile.mkdtemp(dir=work))
    probe = work / "probe.py"
    cpu, started = children_cpu_s(), time.time()
    env = bench_env(PROBE_OUT=str(out), LAUNCHED_AT=repr(started))
    done = subprocess.run(torchrun(nproc, "--monitor-interval=0.5", *WAYS[way], str(probe)), env=env, cwd=work,
                          capture_output=True, text=True, timeout=300)
    wall, cpu = time.time() - started, children_cpu_s() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{way} x{nproc} exited {done.returncode}: {done.stderr[-2000:]}")
    ready = [json.loads(p.read_text())["ready_s"] for p in sorted(out.glob("rank*.json"))]
    if len(ready) != nproc:
        raise RuntimeError(f"{way} x{nproc}: {len(ready)} of {nproc} ranks reported")
    return {"way": way, "nproc": nproc, "ready_s": max(ready), "wall_s": wall, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("bench.rank_start", __doc__, rounds=5).parse_args(argv)
    info = machine()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rank-start-") as tmp:
        work = Path(tmp)
        (work / "probe.py").write_text(PROBE)
        for nproc in (1, 2):
            for _ in range(args.rounds):
                for way in WAYS:
                    runs.append(launch(way, nproc, work))
    rows = []
    for nproc in (1, 2):
        for way in WAYS:
            mine = [r for r in runs if r["way"] == way and r["nproc"] == nproc]
            rows.append({"way": way, "nproc": nproc, "launches": len(mine),
                         **{f"{k}_median": round(statistics.median(r[k] for r in mine), 2) for k in ("ready_s", "wall_s", "cpu_s")},
                         "ready_s_range": [round(min(r["ready_s"] for r in mine), 2), round(max(r["ready_s"] for r in mine), 2)]})
    log.info("%-5s %5s %9s %14s %9s %9s", "ranks", "way", "launches", "ready s (med)", "range", "CPU-s (med)")
    for r in rows:
        log.info("%-5d %5s %9d %14.2f %4.2f-%-4.2f %9.2f", r["nproc"], r["way"], r["launches"], r["ready_s_median"],
                 *r["ready_s_range"], r["cpu_s_median"])
    write_results(args.out, {"machine": info, "rows": rows, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
