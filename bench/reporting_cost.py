"""The cost of rank-0 metric reporting on step time, measured inside one torchrun launch.

    torchrun --standalone --nproc-per-node 2 bench/reporting_cost.py --out result.json [--alt path/to/metrics.py]

The trainer's step (the example MLP under DDP with bucket views, AdamW, clipping by the global norm)
runs in blocks of 20 steps, cycling through: no reporting, ``MetricsReporter`` every 10 steps, every
step. Because the modes alternate every ~0.1 s inside the same processes, whatever else the machine
is doing hits all of them alike; the median block time of each mode gives its step time. ``--alt``
loads another ``MetricsReporter`` (e.g. an older trainer/metrics.py) as two more modes, for a
before/after comparison in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--block", type=int, default=20, help="steps per block; short blocks pair the modes more tightly")
    ap.add_argument("--alt", type=Path, help="another trainer/metrics.py whose MetricsReporter is measured too")
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

    reporters = {"trainer": MetricsReporter}
    if args.alt:
        spec = importlib.util.spec_from_file_location("alt_metrics", args.alt)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        reporters["alt"] = module.MetricsReporter
    run_dir = Path(tempfile.mkdtemp(prefix="reporting-cost-"))
    total = 10**9  # never "the last step": every mode reports on its cadence only
    modes: dict[str, object | None] = {"none": None}
    for name, cls in reporters.items():
        for every in (10, 1):
            out = run_dir / f"{name}-{every}"
            out.mkdir()
            events = EventWriter(out, enabled=rank == 0)
            modes[f"{name}_every_{every}"] = cls(events, info, every, total, 64)

    step = 0

    def train_step(reporter: object | None) -> None:
        nonlocal step
        i = (step * micro) % (len(x) - micro)
        loss = F.cross_entropy(net(x[i:i + micro]), y[i:i + micro])
        loss.backward()
        norm = _grad_norm_and_clip(net, 1.0)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if reporter is not None:
            reporter.train_step(step, 0, loss.detach(), norm, lr)  # type: ignore[attr-defined]

    for _ in range(100):  # warm-up
        train_step(None)
    blocks: dict[str, list[float]] = {m: [] for m in modes}
    for cycle in range(args.cycles):
        order = list(modes) if cycle % 2 == 0 else list(modes)[::-1]
        for mode in order:
            reporter = modes[mode]
            if reporter is not None:
                reporter.reset_window(step)  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            for _ in range(args.block):
                train_step(reporter)
            if reporter is not None and hasattr(reporter, "flush"):
                reporter.flush()  # a pending report belongs to this block
            blocks[mode].append((time.perf_counter() - t0) / args.block)
    if rank == 0:
        step_s = {m: statistics.median(v) for m, v in blocks.items()}
        args.out.write_text(json.dumps({"step_s": step_s, "blocks": blocks, "block_steps": args.block}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
