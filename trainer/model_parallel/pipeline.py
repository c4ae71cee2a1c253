"""Pipeline parallelism with torch.distributed.pipelining: the model cut into stages by blocks.

Every rank builds the whole model (same seed, same initial weights as one rank would), then keeps only
its stages' blocks: the first stage also keeps the embeddings, the last the final norm and the head.
Each stage is a pruned copy of the model (``_prune``), so its parameters keep their whole-model names and
DCP checkpoints are exchangeable with a run without a pipeline. Schedules: GPipe, 1F1B, and interleaved
1F1B with two chunks per rank (chunk s runs on pipeline rank s mod stages).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from trainer import tasks
from trainer.models.spec import PipelineLayout

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def _drop_ends(part: nn.Module, layout: PipelineLayout, first: bool, last: bool) -> None:
    for attr in () if first else layout.first:
        setattr(part, attr, None)
    for attr in () if last else layout.last:
        setattr(part, attr, None)


def _prune(model: nn.Module, layout: PipelineLayout, keep: list[str], first: bool, last: bool) -> nn.Module:
    """A copy of ``model`` with only the blocks named in ``keep``, and its ends only where it has them."""
    part = copy.deepcopy(model)
    blocks: nn.ModuleDict = getattr(part, layout.blocks)
    for key in list(blocks.keys()):
        if key not in keep:
            del blocks[key]
    _drop_ends(part, layout, first, last)
    return part


def _view(owner: nn.Module, layout: PipelineLayout, keep: list[str], first: bool, last: bool) -> nn.Module:
    """A module of the owner's class over the owner's own submodules (shared parameters): one chunk of a rank
    that runs two (interleaved_1f1b), while the owner holds both for the optimizer and the checkpoint."""
    part = copy.copy(owner)
    part.__dict__ = {**owner.__dict__, "_modules": dict(owner._modules), "_parameters": dict(owner._parameters),
                     "_buffers": dict(owner._buffers)}
    blocks: nn.ModuleDict = getattr(owner, layout.blocks)
    setattr(part, layout.blocks, nn.ModuleDict({k: blocks[k] for k in keep}))
    _drop_ends(part, layout, first, last)
    return part


def split_model(model: nn.Module, layout: PipelineLayout, chunks: int, mine: list[int]) -> tuple[nn.Module, list[nn.Module]]:
    """(this rank's model: the blocks of its chunks, with whole-model names; one module per chunk, sharing it)."""
    keys = list(getattr(model, layout.blocks).keys())
    per = len(keys) // chunks
    runs = {c: keys[c * per:(c + 1) * per] for c in mine}
    owner = _prune(model, layout, [k for c in mine for k in runs[c]], 0 in mine, chunks - 1 in mine)
    if len(mine) == 1:
        return owner, [owner]
    return owner, [_view(owner, layout, runs[c], c == 0, c == chunks - 1) for c in mine]


@dataclass
class Pipeline:
    """This rank's stage modules and the schedule that drives them."""

    model: nn.Module  # this rank's blocks under whole-model names: what the optimizer and the checkpoint see
    parts: list[nn.Module]  # one per chunk, wrapped for data parallelism: what the schedule runs
    stage_ids: list[int]
    chunks: int
    schedule: Any
    group: dist.ProcessGroup
    pp_rank: int
    pp_size: int
    task: str

    @property
    def is_last(self) -> bool:
        return self.chunks - 1 in self.stage_ids

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch over all micro-batches; gradients are their mean. Returns the batch
        loss on the last stage and 0 elsewhere, times the stages, so a mean over all ranks is the dp mean."""
        losses: list[torch.Tensor] = []
        if self.stage_ids[0] == 0:
            self.schedule.step(x, target=y if self.is_last else None, losses=losses if self.is_last else None)
        else:
            self.schedule.step(target=y if self.is_last else None, losses=losses if self.is_last else None)
        if not self.is_last:
            return torch.zeros((), device=x.device)
        return torch.stack([loss.detach() for loss in losses]).mean() * self.pp_size

    @torch.no_grad()
    def forward(self, x: torch.Tensor, activation_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """Forward only (eval), stage by stage with point-to-point sends; the model's output on the last stage's
        rank, None on the others. Every rank of a pipeline calls it with the same batch."""
        ranks = dist.get_process_group_ranks(self.group)
        h: torch.Tensor | None = None
        for stage in range(self.chunks):
            owner = stage % self.pp_size
            if owner != self.pp_rank:
                continue
            part = self.parts[self.stage_ids.index(stage)]
            if stage == 0:
                h = x
            elif (stage - 1) % self.pp_size != self.pp_rank:  # the previous chunk is on another rank
                h = torch.empty(activation_shape, device=x.device, dtype=dtype)
                dist.recv(h, src=ranks[(stage - 1) % self.pp_size], group=self.group)
            h = part(h)
            if stage < self.chunks - 1 and (stage + 1) % self.pp_size != self.pp_rank:
                dist.send(h.contiguous(), dst=ranks[(stage + 1) % self.pp_size], group=self.group)
        return h if self.is_last else None


def build_pipeline(model: nn.Module, layout: PipelineLayout, spec: Any, mesh: DeviceMesh, device: torch.device, task: str,
                   wrap: Any, mark: Callable[[str], None] = lambda phase: None) -> Pipeline:
    """Split the model for this rank, move its chunks to ``device`` (then ``mark("to_device")``), wrap each chunk
    for data parallelism (``wrap``) and make the schedule."""
    opts = spec.parallel.pipeline
    pp_mesh = mesh["pp"]
    pp_rank, pp_size = pp_mesh.get_local_rank(), pp_mesh.size()
    interleaved = opts.schedule == "interleaved_1f1b"
    chunks = pp_size * (2 if interleaved else 1)
    stage_ids = list(range(pp_rank, chunks, pp_size))
    owner, chunk_modules = split_model(model, layout, chunks, stage_ids)
    owner.to(device)
    mark("to_device")
    parts = [wrap(part) for part in chunk_modules]
    group = pp_mesh.get_group()
    stages = [PipelineStage(part, s, chunks, device, group=group) for part, s in zip(parts, stage_ids, strict=True)]

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # The mean over a micro-batch; the schedule divides gradients by the micro-batches (scale_grads).
        return tasks.train_loss(task, out, target)

    if interleaved:
        schedule = ScheduleInterleaved1F1B(stages, opts.microbatches, loss_fn=loss_fn)
    else:
        schedule = _SCHEDULES[opts.schedule](stages[0], opts.microbatches, loss_fn=loss_fn)
    return Pipeline(owner, parts, stage_ids, chunks, schedule, group, pp_rank, pp_size, task)
