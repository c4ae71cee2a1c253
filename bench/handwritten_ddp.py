"""The baseline: a plain DDP script written the way the PyTorch DDP tutorial writes one.

    torchrun --standalone --nproc-per-node 2 bench/handwritten_ddp.py --out result.json --steps 400

Same model (the trainer's MLP: Linear/ReLU/Dropout blocks and a head), same synthetic
classification data (the same seeded teacher), AdamW, DistributedSampler, gradient clipping to
1.0, fp32 on gloo. It imports nothing from torchyard, so it measures what torch alone costs.

``--style tutorial``: the tutorial's DataLoader over a TensorDataset and DDP's defaults.
``--style tuned``: what a careful hand-written loop does: the sampler's
indices gather each batch with one indexing op, ``gradient_as_bucket_view=True`` and foreach
gradient clipping. ``--style fused``: tuned, and AdamW's fused kernel (``fused=True``, on the CPU since torch 2.4),
as the trainer takes for plain DDP: the strictest baseline. Rank 0 logs the loss every ``--log-every`` steps, as the tutorial prints
it, and writes the wall-clock time of every logged step to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class MLP(nn.Module):
    def __init__(self, in_features: int, out_features: int, hidden: int, layers: int):
        super().__init__()
        widths = [in_features] + [hidden] * layers
        pairs = zip(widths[:-1], widths[1:], strict=True)
        self.hidden = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Dropout(0.0)) for a, b in pairs)
        self.head = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = layer(x)
        return self.head(x)


def synthetic_classification(samples: int, features: int, classes: int, seed: int = 1234, noise: float = 0.1):
    # The same recipe as trainer/data/synthetic.py (a hidden linear teacher), so the data match.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    logits = x @ teacher / features**0.5
    y = (logits + noise * torch.randn(logits.shape, generator=g)).argmax(dim=1)
    return x, y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--style", choices=["tutorial", "tuned", "fused"], default="tutorial")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, y = synthetic_classification(args.samples, args.features, args.classes)
    tuned = args.style in ("tuned", "fused")
    model = DDP(MLP(args.features, args.classes, args.hidden, args.layers), gradient_as_bucket_view=tuned)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, **({"fused": True} if args.style == "fused" else {}))
    batch = args.global_batch // world
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)

    def batches(epoch: int):
        sampler.set_epoch(epoch)
        if not tuned:
            yield from loader
            return
        idx = torch.tensor(list(sampler))
        for i in range(len(idx) // batch):
            sel = idx[i * batch:(i + 1) * batch]
            yield x[sel], y[sel]

    times: dict[int, float] = {}
    step, epoch = 0, 0
    model.train()
    while step < args.steps:
        for xb, yb in batches(epoch):
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=tuned or None)
            optimizer.step()
            step += 1
            # The tutorial's progress print: 0-based "batch i % log_every == 0" logs the first step too.
            if (step - 1) % args.log_every == 0:
                value = loss.item()
                if rank == 0:
                    times[step] = time.time()
                    print(f"step {step} loss {value:.4f}", flush=True)  # noqa: T201 - the tutorial's progress line
            if step >= args.steps:
                break
        epoch += 1
    if rank == 0:
        args.out.write_text(json.dumps({"times": times, "world_size": world, "pid": os.getpid()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Its figures are written: gloo's threads can still abort the interpreter's teardown (SIGABRT after the last
    # step), which would fail the whole bench run for nothing. Script jobs get the same ending (trainer/rank_bootstrap.py).
    sys.stdout.flush()
    os._exit(0)
