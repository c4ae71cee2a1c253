"""``python -m bench.found_scan``: what the worker's look for a script job's own files costs, per tail, in one tick
that walks the run directory (as every ``RESCAN_S`` = 2 s does while the job runs).

Two run directories: a small one (a script and its outputs) and one with a 20,000-file dataset in its working
directory, where each walk stops at ``MAX_WALK`` entries. Each holds what the tails read: a TensorBoard event file,
an MLflow file store and, where mlflow is installed, an MLflow SQLite store (written by MLflow itself), a Hugging Face
checkpoint's ``trainer_state.json``, a Lightning ``metrics.csv``, the ranks' merged log with nanoGPT's lines (read
with a ``metrics.from_output`` template), and a Lightning checkpoint. Each tail reads once (the files' contents,
unchanged afterwards), then ``--rounds`` ticks are timed with a forced walk, each tail alone and all together as a
supervisor tick runs them (one shared walk).
The MLflow SQLite store is read again each round (its cost is the reader process); the others find nothing new.
Prints a table and writes bench/results/found-scan.json.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import bench_parser, machine, write_results

log = logging.getLogger("bench")

MLFLOW_LOG = '''
import mlflow
with mlflow.start_run():
    for step in range(200):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
'''


PRINTED = "iter {step}: loss {train/loss}, time {time_ms}ms, mfu {mfu}%"  # nanoGPT's line, as metrics.from_output


def make_run_dir(root: Path, dataset_files: int) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    work = root / "workdir"
    for i in range(dataset_files):
        folder = work / "data" / f"d{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i % 100:03d}.txt").write_bytes(b"")
    writer = SummaryWriter(str(work / "lightning_logs" / "version_0"))
    for step in range(200):
        writer.add_scalar("train_loss", 1.0 / (step + 1), step)
    writer.close()
    torch.save({"global_step": 200}, work / "lightning_logs" / "version_0" / "epoch=0-step=200.ckpt")
    state = {"global_step": 200, "log_history": [{"loss": 1.0 / s, "learning_rate": 1e-4, "epoch": s / 100, "step": s}
                                                 for s in range(1, 201)]}
    (work / "out" / "checkpoint-200").mkdir(parents=True)
    (work / "out" / "checkpoint-200" / "trainer_state.json").write_text(json.dumps(state, indent=2))
    csv_rows = "".join(f"0,{s},{1.0 / (s + 1)}\n" for s in range(200))
    (work / "lightning_logs" / "version_1").mkdir(parents=True)
    (work / "lightning_logs" / "version_1" / "metrics.csv").write_text("epoch,step,train_loss\n" + csv_rows)
    (root / "logs" / "attempt-1").mkdir(parents=True)
    (root / "logs" / "attempt-1" / "ranks.log").write_text("".join(
        f"[rank {r}] iter {s}: loss {1.0 / s:.4f}, time 120.00ms, mfu 38.10%\n" for s in range(1, 201) for r in (0, 1)))
    run = work / "mlruns" / "0" / "0123456789abcdef"
    (run / "metrics").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: 0123456789abcdef\n")
    (run / "metrics" / "loss").write_text("".join(f"{1796650000000 + s} {1.0 / (s + 1)} {s}\n" for s in range(200)))
    try:
        import mlflow  # noqa: F401 - only whether it is there
    except ImportError:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    subprocess.run([sys.executable, "-c", MLFLOW_LOG], cwd=work, env=env, check=True, capture_output=True, timeout=300)


def timed(fn: Callable[[], Any], rounds: int) -> dict[str, float]:
    fn()  # the first read takes the files' contents; what is timed is a tick that finds nothing new
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def measure(run_dir: Path, rounds: int) -> dict[str, dict[str, float]]:
    from jobspec.output_metrics import compile_template
    from worker.checkpoints_found import discover
    from worker.csv_tail import CsvLoggerTail
    from worker.found import MetricTails
    from worker.hf_state_tail import TrainerStateTail
    from worker.mlflow_tail import MlflowFilesTail, MlflowTail
    from worker.output_tail import OutputMetricsTail
    from worker.tb_tail import TensorBoardTail
    from worker.wandb_tail import WandbTail

    templates = [compile_template(PRINTED)]

    def tick(tail: Any) -> Callable[[], Any]:
        def read() -> None:
            tail.ack(len(tail.read(force_scan=True)))
            for one in getattr(tail, "tails", [tail]):
                if isinstance(one, MlflowTail):
                    for state in one.files.values():  # read the store again, as a job that goes on logging makes it
                        state.seen = None
        return read

    tails = {"tensorboard": TensorBoardTail(run_dir, 0.0), "wandb": WandbTail(run_dir, 0.0),
             "mlflow sqlite": MlflowTail(run_dir, 0.0, read_s=0.0), "mlflow files": MlflowFilesTail(run_dir, 0.0),
             "hf trainer state": TrainerStateTail(run_dir, 0.0), "lightning csv": CsvLoggerTail(run_dir, 0.0),
             "printed lines": OutputMetricsTail(run_dir, templates, 0.0)}
    rows = {name: timed(tick(tail), rounds) for name, tail in tails.items()}
    # What a supervisor tick runs: every tail together, sharing one walk of the run directory.
    together = MetricTails(run_dir, 0.0, templates)
    for tail in together.tails:
        if isinstance(tail, MlflowTail):
            tail.read_s = 0.0
    rows["all, one walk"] = timed(tick(together), rounds)
    rows["checkpoints"] = timed(lambda: discover(run_dir, [], time.time(), settle_s=0.0), rounds)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("bench.found_scan", __doc__, rounds=20).parse_args(argv)
    results: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "trees": {}}
    with tempfile.TemporaryDirectory(prefix="found-scan-") as tmp:
        for tree, files in (("small", 0), ("20k-file dataset", 20_000)):
            run_dir = Path(tmp) / tree.split()[0]
            make_run_dir(run_dir, files)
            results["trees"][tree] = measure(run_dir, args.rounds)
    log.info("%-18s %-20s %10s %8s", "run directory", "tail", "median ms", "max ms")
    for tree, rows in results["trees"].items():
        for name, row in rows.items():
            log.info("%-18s %-20s %10.2f %8.2f", tree, name, row["median_ms"], row["max_ms"])
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
