"""Data parallelism: DDP or FSDP2, chosen by ``parallel.strategy``. The only place models meet torch.distributed."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer.distributed import RankInfo
from trainer.models import model_blocks
from trainer.spec import JobSpec

log = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Parallelized:
    """The wrapped model and what the loop needs to know about how it was wrapped."""

    model: nn.Module
    strategy: str
    # FSDP2 casts parameters itself (MixedPrecisionPolicy), so the loop must not also autocast.
    autocast_dtype: torch.dtype | None
    mesh: object | None = None


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of storing them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply_ac

    blocks = set(map(id, model_blocks(model)))
    apply_ac(model, check_fn=lambda m: id(m) in blocks)


def apply_ddp(model: nn.Module, rank: RankInfo, spec: JobSpec) -> Parallelized:
    opts = spec.parallel.ddp
    if rank.world_size > 1 and has_batchnorm(model):
        # Batch statistics over the global batch, so 2 ranks of 32 behave like 1 rank of 64.
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = DDP(
        model,
        device_ids=[rank.device.index] if rank.device.type == "cuda" else None,
        bucket_cap_mb=opts.bucket_cap_mb,
        gradient_as_bucket_view=opts.gradient_as_bucket_view,
        find_unused_parameters=opts.find_unused_parameters,
        static_graph=opts.static_graph,
    )
    precision = spec.train.precision
    return Parallelized(ddp, "ddp", None if precision == "fp32" else _DTYPES[precision])


def _fsdp_mesh(rank: RankInfo, hsdp: bool):
    from torch.distributed.device_mesh import init_device_mesh

    device_type = rank.device.type
    if hsdp and rank.nnodes > 1 and rank.world_size % rank.local_world_size == 0:
        # HSDP: replicate across nodes (slow links), shard within a node (fast links).
        return init_device_mesh(device_type, (rank.nnodes, rank.local_world_size), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (rank.world_size,), mesh_dim_names=("shard",))


def apply_fsdp(model: nn.Module, rank: RankInfo, spec: JobSpec) -> Parallelized:
    """FSDP2: ``fully_shard`` each block, then the root, so blocks all-gather one at a time."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    opts = spec.parallel.fsdp
    if rank.world_size > 1 and has_batchnorm(model):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    mesh = _fsdp_mesh(rank, opts.hsdp)
    precision = spec.train.precision
    # Parameters compute in bf16/fp16 but gradients are reduced in fp32 so sums over many ranks stay accurate.
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[precision], reduce_dtype=torch.float32) if precision != "fp32" else MixedPrecisionPolicy()
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": opts.reshard_after_forward}
    if opts.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=rank.device.type == "cuda")
    for block in model_blocks(model):
        fully_shard(block, **kwargs)
    # The root keeps its parameters gathered after forward: backward needs them first anyway.
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    return Parallelized(model, "fsdp", None, mesh)


def parallelize(model: nn.Module, rank: RankInfo, spec: JobSpec) -> Parallelized:
    """Move the model to its device, optionally checkpoint activations and compile, then wrap it."""
    if spec.train.activation_checkpointing:
        apply_activation_checkpointing(model)
    if spec.parallel.strategy == "fsdp":
        if not spec.parallel.fsdp.cpu_offload:
            model.to(rank.device)
        wrapped = apply_fsdp(model, rank, spec)
    else:
        model.to(rank.device)
        wrapped = apply_ddp(model, rank, spec)
    if spec.train.compile:
        # Compile the per-block modules' forward in place so FQNs (and checkpoints) keep their names.
        for block in model_blocks(model):
            block.compile()
    log.info("model parallelized with %s over %d ranks", wrapped.strategy, dist.get_world_size() if dist.is_initialized() else 1)
    return wrapped
