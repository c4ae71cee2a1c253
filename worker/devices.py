"""The worker's GPUs, and a job's ranks placed on them.

``parallel.nproc_per_node: "gpu"`` means one rank per GPU of the worker that claims the job; a number
larger than the worker's GPUs would put two ranks on one device (NCCL refuses that, or the ranks share
memory and run out of it), so the claim fails with a clear error instead. Torch-free: GPUs are counted
from TORCHYARD_WORKER_GPUS, else CUDA_VISIBLE_DEVICES, else the NVIDIA driver's /proc entries.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from jobs.settings import Settings
from trainer.spec import AnySpec, ScriptJobSpec, SpecLimits, spec_from_dict, spec_problems

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


class PlacementError(ValueError):
    """The job's ranks do not fit this worker's GPUs; the message names the field."""


def gpu_count(settings: Settings, proc_dir: Path = NVIDIA_PROC) -> int:
    """GPUs this worker may use: the operator's count (TORCHYARD_WORKER_GPUS), else what CUDA_VISIBLE_DEVICES
    lists, else the GPUs the NVIDIA driver reports; 0 on a host without one."""
    if settings.worker_gpus is not None:
        return settings.worker_gpus
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid id ("-1" is the usual way to hide every GPU).
        return next((i for i, v in enumerate(ids) if v.strip().startswith("-")), len(ids))
    try:
        return sum(1 for _ in proc_dir.iterdir())
    except OSError:
        return 0


def place(raw: dict[str, Any], gpus: int, worker: str, limits: SpecLimits | None = None) -> dict[str, Any]:
    """The spec with ``nproc_per_node`` as this worker's number of ranks; raises PlacementError.

    ``"gpu"`` becomes ``gpus``. A job that would use GPUs (device auto or cuda on a worker with GPUs)
    must not ask for more ranks than there are GPUs. Once the number is known, the rules that depend
    on it (a global batch divisible by the ranks, a mesh that divides them) are checked again."""
    parallel = raw.get("parallel") or {}
    nproc = parallel.get("nproc_per_node", 1)
    device = parallel.get("device", "auto")
    if nproc == "gpu":
        if gpus == 0:
            raise PlacementError(f"parallel.nproc_per_node: 'gpu' asks for one rank per GPU, but worker {worker} has no GPU")
        placed = copy.deepcopy(raw)
        placed.setdefault("parallel", {})["nproc_per_node"] = gpus
    else:
        placed = raw
    count = placed.get("parallel", {}).get("nproc_per_node", 1)
    if gpus > 0 and device != "cpu" and count > gpus:
        raise PlacementError(f"parallel.nproc_per_node: {count} ranks per node, but worker {worker} has {gpus} GPUs; "
                             f"ranks would share devices (use 'gpu' for all of them, or at most {gpus})")
    if placed is not raw:
        problems = spec_problems(spec_from_dict(placed), limits)
        if problems:
            raise PlacementError("; ".join(f"{p.field}: {p.msg} (nproc_per_node 'gpu' is {gpus} on worker {worker})"
                                           for p in problems))
    return placed


CPU_ONLY_ENV = {"ACCELERATE_USE_CPU": "1"}  # without it, Accelerate and the HF Trainer run each CPU rank alone


def cpu_env(spec: AnySpec, gpus: int) -> AnySpec:
    """A script placed on CPUs only (device cpu, or a worker without GPUs) gets what the Hugging Face libraries need to
    run distributed there; a value the job set itself wins."""
    if not isinstance(spec, ScriptJobSpec) or (spec.parallel.device != "cpu" and gpus > 0):
        return spec
    return spec.model_copy(update={"env": {**CPU_ONLY_ENV, **spec.env}})
