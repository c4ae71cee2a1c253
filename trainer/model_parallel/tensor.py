"""Tensor parallelism for gpt with DTensor ``parallelize_module`` (Megatron-style, as torchtitan plans it).

In each block, q, k, v and the MLP's first layer are split column-wise (each rank computes its heads and its
slice of the hidden width) and the attention and MLP output projections row-wise (partial sums all-reduced
back to a replicated activation): two all-reduces per block in forward, two in backward. Embeddings, norms
and the head stay replicated, so the input and the logits are whole on every rank.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

BLOCK_PLAN = {
    "attn.q": ColwiseParallel(),
    "attn.k": ColwiseParallel(),
    "attn.v": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.fc": ColwiseParallel(),
    "mlp.proj": RowwiseParallel(),
}


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard every block of a gpt over ``tp_mesh`` in place; parameter names do not change."""
    for block in model.blocks():
        parallelize_module(block, tp_mesh, BLOCK_PLAN)
