"""The trainer's step on the example MLP, run in interleaved blocks: the harness of the per-step cost benches.

Each mode (a way of reporting) runs blocks of a few steps in turn, order reversed every cycle, inside the
same processes, so whatever else the machine does hits all modes alike; the median block time of a mode is
its step time. Used under torchrun by ``bench/reporting_cost.py`` and ``bench/tracking_cost.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.data.base import DataInfo
from trainer.distributed import RankInfo
from trainer.loop import _grad_norm_and_clip
from trainer.models import build_model

GLOBAL_BATCH = 64
NEVER_LAST = 10**9  # total steps given to reporters: no step is "the last", every mode reports on its cadence


class StepLoop:
    """The example MLP under DDP (bucket views), AdamW and clipping by the global norm, on synthetic data."""

    def __init__(self) -> None:
        dist.init_process_group("gloo")
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.info = RankInfo(self.rank, self.rank, world, world, torch.device("cpu"), "gloo")
        torch.manual_seed(0)
        self.net = DDP(build_model("mlp", {"hidden": 256, "layers": 2, "dropout": 0.0}, DataInfo("classification", (32,), 10)),
                       gradient_as_bucket_view=True)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3)
        self.params = list(self.net.parameters())
        g = torch.Generator().manual_seed(self.rank)
        self.x, self.y = torch.randn(4096, 32, generator=g), torch.randint(10, (4096,), generator=g)
        self.micro = GLOBAL_BATCH // world
        self.step = 0

    def train_step(self, reporter: object | None) -> None:
        """One optimizer step, reported through ``reporter.train_step`` when one is given."""
        i = (self.step * self.micro) % (len(self.x) - self.micro)
        loss = F.cross_entropy(self.net(self.x[i:i + self.micro]), self.y[i:i + self.micro])
        loss.backward()
        norm = _grad_norm_and_clip(self.params, 1.0)
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        if reporter is not None:
            reporter.train_step(self.step, 0, loss.detach(), norm, lr)  # type: ignore[attr-defined]

    def interleave(self, modes: Mapping[str, object | None], cycles: int, block: int,
                   after_block: Callable[[object | None], None] | None = None) -> dict[str, list[float]]:
        """Seconds per step of every block of every mode; ``after_block`` runs inside the block's time."""
        blocks: dict[str, list[float]] = {m: [] for m in modes}
        for cycle in range(cycles):
            order = list(modes) if cycle % 2 == 0 else list(modes)[::-1]
            for mode in order:
                reporter = modes[mode]
                if reporter is not None:
                    reporter.reset_window(self.step)  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                for _ in range(block):
                    self.train_step(reporter)
                if after_block is not None:
                    after_block(reporter)
                blocks[mode].append((time.perf_counter() - t0) / block)
        return blocks


def medians(blocks: Mapping[str, list[float]]) -> dict[str, float]:
    return {m: statistics.median(v) for m, v in blocks.items()}
