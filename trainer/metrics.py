"""Training metrics: decides when to report, reduces across ranks at those steps only, emits on rank 0."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from trainer.distributed import RankInfo
from trainer.events import EventWriter


def memory_bytes(device: torch.device) -> int:
    """Peak CUDA memory allocated on a GPU; process RSS on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


# Dense bf16 peak FLOP/s per GPU for MFU; unknown GPUs report no MFU rather than a wrong one.
_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12, "4090": 165e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in _PEAK_FLOPS.items() if k in name), None)


class MetricsReporter:
    """All ranks call ``train_step``; only log steps cost a collective and a host sync."""

    def __init__(self, events: EventWriter, rank: RankInfo, every: int, total_steps: int, global_batch: int,
                 tokens_per_sample: int | None = None, flops_per_sample: float | None = None):
        self.events = events
        self.rank = rank
        self.every = every
        self.total_steps = total_steps
        self.global_batch = global_batch
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_sample = flops_per_sample
        self.peak = peak_flops(rank.device)
        self.agreed_step_time: float | None = None  # rank 0's last reported step time, equal on every rank
        self.reset_window(0)

    def reset_window(self, step: int) -> None:
        """Start timing from here; call after anything (eval, checkpoint) that is not training."""
        self._t0 = time.perf_counter()
        self._step0 = step

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total_steps

    def train_step(self, step: int, epoch: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float) -> dict[str, float]:
        """Report step ``step`` (1-based) with its summed micro-batch loss; a collective on every rank."""
        if not self.due(step):
            return {}
        elapsed = time.perf_counter() - self._t0
        steps = max(1, step - self._step0)
        norm = grad_norm.detach().float() if grad_norm is not None else torch.zeros((), device=loss.device)
        # Rank 0's step time rides along (others add 0), so every rank gets exactly the same number.
        own_time = torch.tensor(elapsed / steps if self.rank.is_main else 0.0, device=loss.device)
        stats = torch.stack([loss.detach().float(), norm, own_time.float()])
        if self.rank.world_size > 1:
            dist.all_reduce(stats)
            stats[:2] /= self.rank.world_size  # the grad norm is already global; averaging equal values keeps it
        loss_v, norm_v, self.agreed_step_time = stats.tolist()  # the one host sync of a log step
        samples_per_s = steps * self.global_batch / elapsed if elapsed > 0 else 0.0
        values = {
            "train/loss": loss_v,
            "train/lr": lr,
            "train/samples_per_s": samples_per_s,
            "train/step_time_s": elapsed / steps,
            "train/mem_bytes": float(memory_bytes(self.rank.device)),
        }
        if grad_norm is not None:
            values["train/grad_norm"] = norm_v
        if self.tokens_per_sample:
            values["train/tokens_per_s"] = samples_per_s * self.tokens_per_sample
        if self.flops_per_sample and self.peak:
            values["train/mfu"] = samples_per_s * self.flops_per_sample / (self.peak * self.rank.world_size)
        self.events.metric(step, epoch, values)
        self.reset_window(step)
        return values
