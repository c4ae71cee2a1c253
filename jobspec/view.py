"""A stored spec read back: the job table keeps a spec as the JSON its JobSpec dumped at submission, and every
reader after that (the scheduler, the worker, the job detail) asks the same few questions of it. They ask them
here, with the defaults the spec models declare, so no reader copies a default or guards a missing section its
own way. Rows written before a field existed read as that field's default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobspec.spec import JobBase, ParallelSpec

_P = ParallelSpec.model_fields


@dataclass(frozen=True)
class StoredSpec:
    kind: str
    nnodes: int
    nproc_per_node: int | str  # "gpu" until a worker places the job
    device: str  # auto, cpu or cuda
    pipeline: bool
    timeout_s: float
    depends_on: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> StoredSpec:
        parallel = spec.get("parallel") or {}
        nproc = parallel.get("nproc_per_node", _P["nproc_per_node"].default)
        return cls(
            kind=spec.get("kind") or "catalog",
            nnodes=int(parallel.get("nnodes", _P["nnodes"].default)),
            nproc_per_node=nproc if nproc == "gpu" else int(nproc),
            device=parallel.get("device", _P["device"].default),
            pipeline=bool(parallel.get("pipeline")),
            timeout_s=float(spec.get("timeout_s") or JobBase.model_fields["timeout_s"].default),
            depends_on=tuple(spec.get("depends_on") or ()),
        )
