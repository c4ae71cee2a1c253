"""Build the model-parallel layout of a job: the mesh, then pipeline stages or tensor-parallel shards, then
DDP or FSDP2 over the data-parallel dimension."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from jobspec.spec import JobSpec
from trainer.distributed import RankInfo
from trainer.model_parallel.mesh import build_mesh, data_rank
from trainer.model_parallel.pipeline import build_pipeline
from trainer.model_parallel.tensor import apply_tensor_parallel
from trainer.models import full_args, model_blocks, model_spec

log = logging.getLogger(__name__)


def _fsdp(module: nn.Module, dp_mesh: Any, spec: JobSpec) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    after_forward = spec.parallel.fsdp.reshard_after_forward
    for block in model_blocks(module):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=after_forward)
    fully_shard(module, mesh=dp_mesh, reshard_after_forward=False)
    return module


def apply_model_parallel(model: nn.Module, rank: RankInfo, spec: JobSpec, task: str,
                         mark: Callable[[str], None] = lambda phase: None) -> dict[str, Any]:
    """The pieces of a ``Parallelized`` for a pipeline or tensor-parallel job (see trainer/parallel.py).
    ``mark("to_device")`` once this rank's part of the model is on its device: the mesh and, for a pipeline, the
    split come first, so that a rank copies only its own stages."""
    mesh = build_mesh(rank, spec)
    dp_mesh = mesh["dp"]
    dp = dp_mesh.size()
    strategy = spec.parallel.strategy
    # jobspec.rules admits only models whose catalog entry names pipeline blocks or tensor heads; their SPEC says how.
    model_knows = model_spec(spec.model.name)
    assert model_knows is not None
    log.info("model-parallel mesh %s %s, %s over dp", tuple(mesh.shape), mesh.mesh_dim_names, strategy if dp > 1 else "nothing")
    if spec.parallel.pipeline is not None:
        def wrap(part: nn.Module) -> nn.Module:
            if dp == 1:
                return part
            if strategy == "fsdp":
                return _fsdp(part, dp_mesh, spec)
            # DDP semantics through FSDP2's machinery (replicated DTensor parameters, gradients all-reduced): the
            # stage drives its gradient sync across micro-batches, which the DDP class's bucket rebuild does not survive.
            from torch.distributed._composable.replicate_with_fsdp import replicate

            return replicate(part, mesh=dp_mesh)

        assert model_knows.pipeline is not None
        pipe = build_pipeline(model, model_knows.pipeline, spec, mesh, rank.device, task, wrap, mark)
        return {"model": pipe.model, "strategy": f"{strategy}+pp", "mesh": mesh, "data_rank": data_rank(rank, mesh), "pipeline": pipe}
    model.to(rank.device)
    mark("to_device")
    assert model_knows.tensor_plan is not None
    apply_tensor_parallel(model, mesh["tp"], model_knows.tensor_plan)
    if dp > 1:
        _fsdp(model, dp_mesh, spec)
    return {"model": model, "strategy": f"{strategy}+tp" if dp > 1 else "tp", "mesh": mesh, "data_rank": data_rank(rank, mesh),
            "tp_leader": mesh["tp"].get_local_rank() == 0}


def eval_forward(wrapped: Any, x: torch.Tensor, spec: JobSpec) -> torch.Tensor | None:
    """The model's output for an eval batch, or None on ranks whose output must not be counted (pipeline stages
    before the last, tensor-parallel ranks but the first: they hold the same output as their leader)."""
    pipe = wrapped.pipeline
    if pipe is not None:
        layout = model_spec(spec.model.name).pipeline
        shape = layout.activation(full_args(spec.model.name, spec.model.args), tuple(x.shape))
        return pipe.forward(x, shape, torch.float32)
    out = wrapped.model(x)
    return out if wrapped.tp_leader else None
