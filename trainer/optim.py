"""Optimizer and learning-rate schedule from the spec's train section."""

from __future__ import annotations

import math

import torch
from torch import nn

from jobspec.spec import ScheduleSpec, TrainSpec


def build_optimizer(model: nn.Module, train: TrainSpec, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW or SGD. Weight decay applies to matrices only (not biases or norm scales), as in nanoGPT."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    # The caller decides: fused kernels need every parameter on one device type (trainer/loop.py).
    extra = {"fused": True} if fused else {}
    if train.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas), **extra)
    return torch.optim.SGD(groups, lr=train.lr, momentum=train.momentum, **extra)


def lr_factor(step: int, schedule: ScheduleSpec, total_steps: int) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based): linear warmup, then constant or cosine."""
    warmup = schedule.warmup_steps
    if step < warmup:
        return (step + 1) / warmup  # the first step already learns; the peak is reached at step warmup - 1
    if schedule.name == "constant":
        return 1.0
    span = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    return schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    schedule = train.schedule

    def factor(step: int) -> float:
        return lr_factor(step, schedule, total_steps)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
