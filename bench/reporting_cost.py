"""The cost of rank-0 metric reporting on step time, measured inside one torchrun launch.

    torchrun --standalone --nproc-per-node 2 -m bench.reporting_cost --out result.json [--alt path/to/metrics.py]

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
import tempfile
from pathlib import Path

import torch.distributed as dist

from bench.step_loop import GLOBAL_BATCH, NEVER_LAST, StepLoop, medians
from torchyard.events import EventWriter
from trainer.metrics import MetricsReporter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--block", type=int, default=20, help="steps per block; short blocks pair the modes more tightly")
    ap.add_argument("--alt", type=Path, help="another trainer/metrics.py whose MetricsReporter is measured too")
    args = ap.parse_args()
    loop = StepLoop()

    reporters = {"trainer": MetricsReporter}
    if args.alt:
        spec = importlib.util.spec_from_file_location("alt_metrics", args.alt)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        reporters["alt"] = module.MetricsReporter
    run_dir = Path(tempfile.mkdtemp(prefix="reporting-cost-"))
    modes: dict[str, object | None] = {"none": None}
    for name, cls in reporters.items():
        for every in (10, 1):
            out = run_dir / f"{name}-{every}"
            out.mkdir()
            events = EventWriter(out, enabled=loop.rank == 0)
            modes[f"{name}_every_{every}"] = cls(events, loop.info, every, NEVER_LAST, GLOBAL_BATCH)

    for _ in range(100):  # warm-up
        loop.train_step(None)

    def flush(reporter: object | None) -> None:
        if reporter is not None and hasattr(reporter, "flush"):
            reporter.flush()  # a pending report belongs to this block

    blocks = loop.interleave(modes, args.cycles, args.block, after_block=flush)
    if loop.rank == 0:
        args.out.write_text(json.dumps({"step_s": medians(blocks), "blocks": blocks, "block_steps": args.block}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
