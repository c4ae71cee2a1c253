"""The cost of the TensorBoard and MLflow sinks on step time, measured inside one torchrun launch.

    torchrun --standalone --nproc-per-node 2 bench/tracking_cost.py --out result.json [--mlflow-uri http://...]

The trainer's step (the example MLP under DDP, AdamW, clipping) runs in blocks of 20 steps, cycling
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
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.data.base import DataInfo
from trainer.distributed import RankInfo
from trainer.engine import _grad_norm_and_clip
from trainer.events import EventWriter
from trainer.metrics import MetricsReporter
from trainer.models import build_model
from trainer.sinks import SinkRunner
from trainer.sinks.tensorboard import TensorBoardSink


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--every", type=int, default=10, help="log cadence (train.log_every_steps; 10 is the default)")
    ap.add_argument("--mlflow-uri", help="a running MLflow tracking server; without it the mlflow mode is left out")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    info = RankInfo(rank, rank, world, world, torch.device("cpu"), "gloo")
    torch.manual_seed(0)
    net = DDP(build_model("mlp", {"hidden": 256, "layers": 2, "dropout": 0.0}, DataInfo("classification", (32,), 10)),
              gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4096, 32, generator=g), torch.randint(10, (4096,), generator=g)
    micro = 64 // world

    base = Path(tempfile.mkdtemp(prefix="tracking-cost-"))
    total = 10**9
    spec = {"name": "bench-tracking", "train": {"lr": 1e-3, "log_every_steps": args.every}}

    def sinks_for(mode: str, out: Path) -> SinkRunner | None:
        if rank != 0 or mode == "jsonl":
            return None
        if mode == "tensorboard":
            return SinkRunner([TensorBoardSink(out)])
        from trainer.sinks.mlflow import MlflowSink

        return SinkRunner([MlflowSink(args.mlflow_uri, "bench-tracking", out, None, spec)])

    names = ["jsonl", "tensorboard"] + (["mlflow"] if args.mlflow_uri else [])
    writers: dict[str, EventWriter] = {}
    modes: dict[str, MetricsReporter] = {}
    for mode in names:
        out = base / mode
        out.mkdir()
        writers[mode] = EventWriter(out, enabled=rank == 0, sinks=sinks_for(mode, out))
        modes[mode] = MetricsReporter(writers[mode], info, args.every, total, 64)

    step = 0

    def train_step(reporter: MetricsReporter) -> None:
        nonlocal step
        i = (step * micro) % (len(x) - micro)
        loss = F.cross_entropy(net(x[i:i + micro]), y[i:i + micro])
        loss.backward()
        norm = _grad_norm_and_clip(net, 1.0)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        reporter.train_step(step, 0, loss.detach(), norm, lr)

    for _ in range(100):  # warm-up, and lets the sinks' threads open their files and connections
        train_step(modes["jsonl"])
    time.sleep(2.0)
    blocks: dict[str, list[float]] = {m: [] for m in modes}
    for cycle in range(args.cycles):
        order = list(modes) if cycle % 2 == 0 else list(modes)[::-1]
        for mode in order:
            reporter = modes[mode]
            reporter.reset_window(step)
            t0 = time.perf_counter()
            for _ in range(args.block):
                train_step(reporter)
            blocks[mode].append((time.perf_counter() - t0) / args.block)
    delivered: dict[str, dict[str, float]] = {}
    for mode, writer in writers.items():
        t0 = time.perf_counter()
        runner = writer.sinks
        writer.close()  # drains the sink's queue: what the job's end waits for
        if runner is not None:
            delivered[mode] = {"dropped": runner.dropped, "close_s": time.perf_counter() - t0}
    if rank == 0:
        step_s = {m: statistics.median(v) for m, v in blocks.items()}
        args.out.write_text(json.dumps({"step_s": step_s, "blocks": blocks, "block_steps": args.block, "every": args.every,
                                        "sinks": delivered}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
