"""The cost of the TensorBoard and MLflow sinks on step time, measured inside one torchrun launch.

    torchrun --standalone --nproc-per-node 2 -m bench.tracking_cost --out result.json [--mlflow-uri http://...]

The trainer's step (``bench/step_loop.py``) runs in blocks of 20 steps, cycling
through three modes, each reporting with ``MetricsReporter`` at the default cadence (every 10 steps):
events.jsonl only (``jsonl``), plus the TensorBoard sink (``tensorboard``), plus the MLflow sink sending
to a real tracking server (``mlflow``). The modes alternate every ~0.1 s inside the same processes, so
whatever else the machine does hits all of them alike; the median block time of each mode is its step
time. Every sink writes from its own thread, so what is measured is what that thread takes from the
training thread (the GIL, CPU), not a wait.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from bench.step_loop import GLOBAL_BATCH, NEVER_LAST, StepLoop, medians
from torchyard.events import EventWriter
from torchyard.sinks import SinkRunner
from torchyard.sinks.tensorboard import TensorBoardSink
from trainer.metrics import MetricsReporter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--every", type=int, default=10, help="log cadence (train.log_every_steps; 10 is the default)")
    ap.add_argument("--mlflow-uri", help="a running MLflow tracking server; without it the mlflow mode is left out")
    args = ap.parse_args()
    loop = StepLoop()
    rank = loop.rank
    base = Path(tempfile.mkdtemp(prefix="tracking-cost-"))
    spec = {"name": "bench-tracking", "train": {"lr": 1e-3, "log_every_steps": args.every}}

    def sinks_for(mode: str, out: Path) -> SinkRunner | None:
        if rank != 0 or mode == "jsonl":
            return None
        if mode == "tensorboard":
            return SinkRunner([TensorBoardSink(out)])
        from torchyard.sinks.mlflow import MlflowSink

        return SinkRunner([MlflowSink(args.mlflow_uri, "bench-tracking", out, None, spec)])

    names = ["jsonl", "tensorboard"] + (["mlflow"] if args.mlflow_uri else [])
    writers: dict[str, EventWriter] = {}
    modes: dict[str, MetricsReporter] = {}
    for mode in names:
        out = base / mode
        out.mkdir()
        writers[mode] = EventWriter(out, enabled=rank == 0, sinks=sinks_for(mode, out))
        modes[mode] = MetricsReporter(writers[mode], loop.info, args.every, NEVER_LAST, GLOBAL_BATCH)

    for _ in range(100):  # warm-up, and lets the sinks' threads open their files and connections
        loop.train_step(modes["jsonl"])
    time.sleep(2.0)
    blocks = loop.interleave(modes, args.cycles, args.block)
    delivered: dict[str, dict[str, float]] = {}
    for mode, writer in writers.items():
        t0 = time.perf_counter()
        runner = writer.sinks
        writer.close()  # drains the sink's queue: what the job's end waits for
        if runner is not None:
            delivered[mode] = {"dropped": runner.dropped, "close_s": time.perf_counter() - t0}
    if rank == 0:
        step_s = medians(blocks)
        args.out.write_text(json.dumps({"step_s": step_s, "blocks": blocks, "block_steps": args.block, "every": args.every,
                                        "sinks": delivered}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
