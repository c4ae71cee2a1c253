"""The 2-D device mesh of a model-parallel job and the coordinate data parallelism uses."""

from __future__ import annotations

import dataclasses

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from jobspec.spec import JobSpec
from trainer.distributed import RankInfo


def model_parallel_degree(spec: JobSpec) -> tuple[str, int] | None:
    """("pp", stages) or ("tp", ranks), or None for plain data parallelism."""
    p = spec.parallel
    if p.pipeline is not None:
        return "pp", p.pipeline.stages
    if p.tensor > 1:
        return "tp", p.tensor
    return None


def build_mesh(rank: RankInfo, spec: JobSpec) -> DeviceMesh:
    """(dp, pp) or (dp, tp): the model-parallel dimension innermost, so its ranks are neighbours (one node)."""
    name, degree = model_parallel_degree(spec) or ("tp", 1)
    return init_device_mesh(rank.device.type, (rank.world_size // degree, degree), mesh_dim_names=("dp", name))


def data_rank(rank: RankInfo, mesh: DeviceMesh) -> RankInfo:
    """This rank as the data loader and eval see it: ranks that differ only in their pp/tp coordinate read
    the same samples, so rank and world size are the dp coordinate and the dp size."""
    dp = mesh["dp"]
    return dataclasses.replace(rank, rank=dp.get_local_rank(), world_size=dp.size())
