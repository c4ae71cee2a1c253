"""The global gradient norm when parameters are split between pipeline stages and sharded as DTensors."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn


def _group_key(t: torch.Tensor) -> tuple:
    spec = getattr(t, "_spec", None)
    return ("plain",) if spec is None else ("dtensor", id(spec.mesh), tuple(spec.placements))


def clip_grad_norm(parts: list[nn.Module], max_norm: float | None, pp_group: dist.ProcessGroup | None) -> torch.Tensor | None:
    """The 2-norm of all gradients of the whole model, clipped to max_norm (None: no clipping, no norm).

    DTensor gradients (tensor-parallel or FSDP shards) are normed per mesh and placement (``full_tensor`` reduces
    the partial norms); plain ones are whole on this rank. Pipeline stages hold disjoint parameters, so their
    squared norms add up over the pp group."""
    if max_norm is None:
        return None
    # Parameters, not gradients, are grouped: clip_grads_with_norm_ takes parameters. Views of one owner (interleaved
    # chunks) share parameters, so each is counted once.
    params = list({id(p): p for part in parts for p in part.parameters() if p.grad is not None}.values())
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        groups[_group_key(p)].append(p)
    device = params[0].device if params else torch.device("cpu")
    squared = torch.zeros((), device=device)
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type=2.0, foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        squared = squared + norm.float() ** 2
    if pp_group is not None:
        dist.all_reduce(squared, group=pp_group)
    total = squared.sqrt()
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total
