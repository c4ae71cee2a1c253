"""Training metrics: decides when to report, reduces across ranks at those steps only, emits on rank 0."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from torchyard.events import EventWriter
from trainer.distributed import RankInfo
from trainer.system_metrics import SystemSampler

log = logging.getLogger(__name__)


def memory_bytes(device: torch.device, system: SystemSampler) -> int:
    """Peak CUDA memory allocated on a GPU; process RSS (the system sampler's last reading) on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(system.rss_bytes)


# Dense bf16 peak FLOP/s per GPU for MFU; unknown GPUs report no MFU rather than a wrong one.
_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12, "4090": 165e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in _PEAK_FLOPS.items() if k in name), None)


@dataclass
class _Pending:
    """A report whose all-reduce is in flight: completed (waited, written) at a later step."""

    step: int
    epoch: int
    stats: torch.Tensor
    work: Any  # the async all-reduce's handle; None on one rank
    elapsed: float
    steps: int
    lr: float
    has_norm: bool
    wall: float  # when the step ended: the event's time, though it is written a step later
    width: int  # system metrics per rank in ``stats`` after the three training values
    ready: Any = None  # CUDA: the event after which ``stats`` (pinned host memory, already reduced) holds the values


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    """An asynchronous copy of a device tensor into pinned host memory; read it only after an event recorded later."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class MetricsReporter:
    """All ranks call ``train_step``; only log steps cost a collective, and it overlaps the next step.

    A log step starts the all-reduce of (loss, grad norm, rank 0's step time) without waiting for it; the
    report is completed (waited for, one host sync, the metric event written) at the next ``train_step``,
    by which time the reduction has long finished behind that step's compute. On a GPU the values come back
    through pinned memory behind an event, so that sync waits for the log step's work only, never for the
    steps queued after it. Waiting for the gloo round
    trip inside the step was most of a report's cost (docs/BENCHMARKS.md). Order is kept: the writer
    completes a pending report before it writes any other event (``EventWriter.before_emit``), so a step's
    metric event always comes before its checkpoint, eval or status events; the last step completes at once.
    """

    def __init__(self, events: EventWriter, rank: RankInfo, every: int, total_steps: int, global_batch: int,
                 tokens_per_sample: int | None = None, flops_per_sample: float | None = None,
                 pause_step: int | None = None):
        self.events = events
        # Steps reported whatever the log interval, and at once: the end, and a sweep trial's rung.
        self.ends = {total_steps} | ({pause_step} if pause_step is not None else set())
        self.rank = rank
        self.every = every
        self.total_steps = total_steps
        self.global_batch = global_batch
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_sample = flops_per_sample
        self.peak = peak_flops(rank.device)
        self.system = SystemSampler(rank.device)
        self.agreed_step_time: float | None = None  # rank 0's last reported step time, equal on every rank
        # Run by hand (``torchrun -m trainer``), rank 0 also logs each report: there is no service to show the metrics.
        self.echo = rank.is_main and "TORCHYARD_JOB_ID" not in os.environ
        self._pending: _Pending | None = None
        self._completed: dict[str, float] = {}  # values of the last report completed, until train_step returns them
        events.before_emit = self.flush
        self.reset_window(0)

    def reset_window(self, step: int) -> None:
        """Start timing from here; call after anything (eval, checkpoint) that is not training."""
        self._t0 = time.perf_counter()
        self._step0 = step

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step in self.ends

    def train_step(self, step: int, epoch: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float) -> dict[str, float]:
        """Report step ``step`` (1-based) with its summed micro-batch loss; a collective on every rank.

        Returns the values of the report completed since the previous call (an earlier log step's, or the last
        step's), else {}. Equal on every rank: rank 0 alone may have completed it early, when it wrote an event,
        and a return that differed by rank would send the ranks down different collectives."""
        self.flush()
        if self.due(step):
            self._start(step, epoch, loss, grad_norm, lr)
            if step in self.ends:
                self.flush()  # nothing left to overlap it with
        done, self._completed = self._completed, {}
        return done

    def _start(self, step: int, epoch: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float) -> None:
        """Start the log step's all-reduce without waiting for it."""
        elapsed = time.perf_counter() - self._t0
        steps = max(1, step - self._step0)
        norm = grad_norm.detach().float() if grad_norm is not None else torch.zeros((), device=loss.device)
        # Rank 0's step time rides along (others add 0), so every rank gets exactly the same number.
        # Each rank's system sample rides in its own slot of the same all-reduce (others add 0): a gather for free.
        # The host values are one tensor, built in Python: this runs every few milliseconds on a small model.
        width = len(self.system.names)
        host = [elapsed / steps if self.rank.is_main else 0.0] + [0.0] * (self.rank.world_size * width)
        mine = 1 + self.rank.rank * width
        host[mine:mine + width] = self.system.sample()
        # float64: byte counts of several GiB lose their low digits in float32.
        host_t = torch.tensor(host, dtype=torch.float64)
        if loss.is_cuda:
            host_t = host_t.pin_memory()  # a copy from pageable memory would wait for the whole queue of the GPU
        stats = torch.cat([torch.stack([loss.detach().float(), norm]).double(), host_t.to(loss.device, non_blocking=True)])
        work = dist.all_reduce(stats, async_op=True) if self.rank.world_size > 1 else None
        ready = None
        if loss.is_cuda:
            # Off the critical path: NCCL's wait() only orders the GPU's stream (the host goes on), and the values
            # come back through pinned memory behind an event, so flush() waits for this step's values alone. A
            # .tolist() there would wait for every step queued after this one, leaving the GPU idle until the
            # host had queued new work.
            if work is not None:
                work.wait()
                stats[:2] /= self.rank.world_size
                work = None
            stats = _to_pinned(stats)
            ready = torch.cuda.Event()
            ready.record()
        self._pending = _Pending(step, epoch, stats, work, elapsed, steps, lr, grad_norm is not None, time.time(), width, ready)
        self.reset_window(step)

    def flush(self) -> None:
        """Complete the report in flight, if any: wait for its all-reduce and write its metric event.
        Its values are what the next ``train_step`` returns."""
        p, self._pending = self._pending, None
        if p is None:
            return
        if p.ready is not None:
            p.ready.synchronize()  # the GPU is steps past this one by now: no wait in practice
        elif p.work is not None:
            p.work.wait()
            p.stats[:2] /= self.rank.world_size  # the grad norm is already global; averaging equal values keeps it
        loss_v, norm_v, self.agreed_step_time, *sampled = p.stats.tolist()  # the one host sync of a log step
        samples_per_s = p.steps * self.global_batch / p.elapsed if p.elapsed > 0 else 0.0
        values = {
            "train/loss": loss_v,
            "train/lr": p.lr,
            "train/samples_per_s": samples_per_s,
            "train/step_time_s": p.elapsed / p.steps,
            "train/mem_bytes": float(memory_bytes(self.rank.device, self.system)),
        }
        if p.has_norm:
            values["train/grad_norm"] = norm_v
        if self.tokens_per_sample:
            values["train/tokens_per_s"] = samples_per_s * self.tokens_per_sample
        if self.flops_per_sample and self.peak:
            values["train/mfu"] = samples_per_s * self.flops_per_sample / (self.peak * self.rank.world_size)
        values.update(self._system_values(sampled, p.width))
        self.events.emit("metric", step=p.step, epoch=p.epoch, values=values, time=p.wall)
        if self.echo:
            log.info("step %d/%d  loss %.4f  %.0f samples/s", p.step, self.total_steps, loss_v, samples_per_s)
        self._completed = values

    def global_mean(self, value: torch.Tensor) -> float:
        """This rank's value averaged over the ranks; a collective on every rank."""
        v = value.detach().float().clone()
        if self.rank.world_size > 1:
            dist.all_reduce(v)
            v /= self.rank.world_size
        return float(v)

    def epoch_loss(self, step: int, epoch: int, loss_sum: torch.Tensor, steps: int) -> float:
        """Report ``train/epoch_loss``, the mean loss over the epoch's steps; a collective on every rank."""
        value = self.global_mean(loss_sum) / steps
        self.events.metric(step, epoch, {"train/epoch_loss": value})
        return value

    def _system_values(self, sampled: list[float], width: int) -> dict[str, float]:
        """``sys/NAME``: the mean over ranks (rank 0's own value in a one-rank job); with several ranks also
        ``sys/rankN/NAME`` per rank. Values a rank could not read (NaN) are left out."""
        values: dict[str, float] = {}
        per_rank = [sampled[r * width:(r + 1) * width] for r in range(self.rank.world_size)]
        for i, name in enumerate(self.system.names):
            column = [row[i] for row in per_rank if math.isfinite(row[i])]
            if column:
                values[name] = sum(column) / len(column)
            if self.rank.world_size > 1:
                for r, row in enumerate(per_rank):
                    if math.isfinite(row[i]):
                        values[name.replace("sys/", f"sys/rank{r}/", 1)] = row[i]
        return values
