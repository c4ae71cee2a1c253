"""Data parallelism: DDP or FSDP2, chosen by ``parallel.strategy``. The only place models meet torch.distributed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from jobspec.spec import JobSpec
from trainer.distributed import RankInfo
from trainer.models import model_blocks

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
    # Model parallelism (trainer/model_parallel/): the rank as data parallelism sees it (its dp coordinate),
    # the pipeline that runs the stages, and whether this rank counts in eval (the first of its tp group).
    data_rank: RankInfo | None = None
    pipeline: object | None = None
    tp_leader: bool = True


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def maybe_sync_batchnorm(model: nn.Module, rank: RankInfo) -> nn.Module:
    """BatchNorm statistics over the global batch, so 2 ranks of 32 normalise like 1 rank of 64.

    SyncBatchNorm runs on GPUs only; on the CPU each rank keeps its own batch statistics.
    """
    if rank.world_size == 1 or not has_batchnorm(model):
        return model
    if rank.device.type == "cpu":
        log.info("model has BatchNorm; SyncBatchNorm needs a GPU, so on the CPU statistics are per rank")
        return model
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of storing them."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing as apply_ac

    blocks = set(map(id, model_blocks(model)))
    apply_ac(model, check_fn=lambda m: id(m) in blocks)


def apply_ddp(model: nn.Module, rank: RankInfo, spec: JobSpec) -> Parallelized:
    opts = spec.parallel.ddp
    model = maybe_sync_batchnorm(model, rank)
    ddp = DDP(
        model,
        device_ids=[rank.device.index] if rank.device.type == "cuda" else None,
        bucket_cap_mb=opts.bucket_cap_mb,
        gradient_as_bucket_view=opts.gradient_as_bucket_view,
        find_unused_parameters=opts.find_unused_parameters,
        static_graph=opts.static_graph,
    )
    return Parallelized(ddp, "ddp", _autocast_dtype(spec.train.precision))


def _autocast_dtype(precision: str) -> torch.dtype | None:
    return None if precision == "fp32" else _DTYPES[precision]


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
    model = maybe_sync_batchnorm(model, rank)
    mesh = _fsdp_mesh(rank, opts.hsdp)
    log.info("FSDP2 mesh %s %s", tuple(mesh.shape), mesh.mesh_dim_names)
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


def grad_scaler(wrapped: Parallelized, precision: str, device: torch.device):
    """fp16 loss scaling. Under FSDP each rank sees only its gradient shard, so an overflow found on one
    rank must skip the step on all of them: ShardedGradScaler all-reduces found_inf."""
    if precision != "fp16":
        return None
    if wrapped.strategy == "fsdp":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type)
    return torch.amp.GradScaler(device.type)


def reshard(model: nn.Module) -> None:
    """Free gathered FSDP parameters after a forward without backward (eval), which leaves them unsharded."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _replace_blocks(model: nn.Module, wrap) -> None:
    """Replace each block in its parent module by ``wrap(block)``."""
    targets = {id(b) for b in model_blocks(model)}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                parent.register_module(name, wrap(child))


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block (not the whole model): the blocks are identical, so one compiled graph
    is reused, and FSDP's hooks on the block wrappers stay outside the compiled code (as torchtitan does).
    Checkpoint names are unaffected: DCP drops the ``_orig_mod`` prefix."""
    _replace_blocks(model, torch.compile)


def compile_enabled(spec: JobSpec, device: torch.device) -> bool:
    """``train.compile``, or where unset: on CUDA (a GPT-2-small step ran 11% of the H100's peak eager, its
    host launching kernels slower than the GPU ran them: docs/BENCHMARKS.md, "On a GPU"), off on the CPU
    (compiling costs more than the step saves there). Pipeline and tensor parallelism do not compile yet."""
    if spec.train.compile is not None:
        return spec.train.compile
    return device.type == "cuda" and spec.parallel.pipeline is None and spec.parallel.tensor == 1


def start_background_imports(compiled: bool) -> threading.Thread:
    """Import Dynamo (2 s: the first optimizer any job builds imports it) and, for a compiled job, Inductor (2 s more)
    on a thread, while the rank builds its data and model and moves them to the device in torch ops that release the
    GIL. A failure here is left to the main thread's own import, which raises it where it belongs."""

    def load() -> None:
        try:
            import torch._dynamo  # noqa: F401

            if compiled:
                import torch._inductor.compile_fx  # noqa: F401
        except Exception:  # noqa: BLE001
            log.debug("importing ahead of use failed; the main thread imports it when it needs it", exc_info=True)

    thread = threading.Thread(target=load, name="background-imports", daemon=True)
    thread.start()
    return thread


def parallelize(model: nn.Module, rank: RankInfo, spec: JobSpec, task: str = "classification",
                mark: Callable[[str], None] = lambda phase: None) -> Parallelized:
    """The model on its device, then activation checkpointing, compile, and DDP or FSDP2 (torchtitan's order
    for the last three); or, for a pipeline or tensor-parallel job, the 2-D layout of trainer/model_parallel/.
    ``mark("to_device")`` once the model is on its device, so a slow start tells the copy (and a GPU's first
    allocations) from compile's and DDP's set-up. None of the wrappers copies a parameter, so the move may come
    first: an FSDP2 job that offloads to the CPU keeps its model there (fully_shard places the shards)."""
    if spec.parallel.pipeline is not None or spec.parallel.tensor > 1:
        from trainer.model_parallel.apply import apply_model_parallel

        precision = spec.train.precision
        parts = apply_model_parallel(model, rank, spec, task, mark)
        return Parallelized(autocast_dtype=None if precision == "fp32" else _DTYPES[precision], **parts)
    if not (spec.parallel.strategy == "fsdp" and spec.parallel.fsdp.cpu_offload):
        model.to(rank.device)
    mark("to_device")
    if spec.train.activation_checkpointing:
        apply_activation_checkpointing(model)
    compiled = compile_enabled(spec, rank.device)
    alone = spec.parallel.strategy == "ddp" and rank.world_size == 1
    if alone:
        # One rank has no gradients to average: DDP would only add its hooks and a bucket copy per step. And
        # with no hooks to keep between blocks, the whole model compiles as one graph, whose host cost per step
        # is a fraction of twelve blocks' (docs/BENCHMARKS.md, "On a GPU"). Checkpoints are the same: DCP's
        # state dicts drop both wrappers' prefixes. (SyncBatchNorm has nothing to sync on one rank.)
        wrapped = Parallelized(torch.compile(model) if compiled else model, "ddp", _autocast_dtype(spec.train.precision))
    else:
        if compiled:
            apply_compile(model)
        wrapped = apply_fsdp(model, rank, spec) if spec.parallel.strategy == "fsdp" else apply_ddp(model, rank, spec)
    log.info("model parallelized with %s over %d ranks", wrapped.strategy, dist.get_world_size() if dist.is_initialized() else 1)
    return wrapped
