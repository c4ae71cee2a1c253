"""Tensor parallelism with DTensor ``parallelize_module`` (Megatron-style, as torchtitan plans it).

Each block's submodules are split column- or row-wise as the model's ``SPEC.tensor_plan`` says (trainer/models/gpt.py:
q, k, v and the MLP's first layer by columns, the output projections by rows, partial sums all-reduced back to a
replicated activation). Embeddings, norms and the head stay replicated, so the input and the logits are whole on
every rank.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

_STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: Mapping[str, str]) -> None:
    """Shard every block over ``tp_mesh`` in place by the model's plan; parameter names do not change."""
    block_plan = {name: _STYLES[style]() for name, style in plan.items()}
    for block in model.blocks():
        parallelize_module(block, tp_mesh, block_plan)
