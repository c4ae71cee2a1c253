"""The worker's GPUs, and a job's ranks placed on them.

``parallel.nproc_per_node: "gpu"`` means one rank per GPU of the worker that claims the job; a number
larger than the worker's GPUs would put two ranks on one device (NCCL refuses that, or the ranks share
memory and run out of it), so the claim fails with a clear error instead. Torch-free: GPUs are counted
from TORCHYARD_WORKER_GPUS, else CUDA_VISIBLE_DEVICES, else NVML (nvidia-ml-py), else the NVIDIA
driver's /proc entries.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from pathlib import Path
from typing import Any

from jobs.settings import Settings
from jobspec.spec import AnySpec, ScriptJobSpec, SpecLimits, spec_from_dict, spec_problems
from jobspec.view import StoredSpec

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


class PlacementError(ValueError):
    """The job's ranks do not fit this worker's GPUs; the message names the field."""


def gpu_indices(settings: Settings, proc_dir: Path = NVIDIA_PROC, nvml: bool = True) -> tuple[int, ...]:
    """The physical indices of the GPUs this worker's host owns: 0..N-1 for the operator's count
    (TORCHYARD_WORKER_GPUS), else what CUDA_VISIBLE_DEVICES lists, else what NVML or the NVIDIA driver reports;
    empty on a host without one. A rank sees its own through CUDA_VISIBLE_DEVICES set to some of these."""
    if settings.worker_gpus is not None:
        return tuple(range(settings.worker_gpus))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        # CUDA stops at the first invalid id ("-1" is the usual way to hide every GPU).
        count = next((i for i, v in enumerate(ids) if v.startswith("-")), len(ids))
        ids = ids[:count]
        # UUIDs (GPU-...) name no index: the ranks then see positions in this list.
        return tuple(int(v) for v in ids) if all(v.isdigit() for v in ids) and len(set(ids)) == len(ids) else tuple(range(count))
    if nvml:
        found = _nvml_count()
        if found is not None:
            return tuple(range(found))
    try:
        return tuple(range(sum(1 for _ in proc_dir.iterdir())))
    except OSError:
        return ()


def _nvml_count() -> int | None:
    """GPUs the NVIDIA driver reports through NVML; None where nvidia-ml-py or the driver is absent."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses, or OSError without libnvidia-ml
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - as above: treated as no driver
        logging.getLogger(__name__).warning("NVML answered no GPU count; counting from /proc instead")
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def gpu_count(settings: Settings, proc_dir: Path = NVIDIA_PROC) -> int:
    """GPUs this worker may use (see gpu_indices); 0 on a host without one."""
    # NVML reads the real driver: a test's stand-in for /proc is asked instead.
    return len(gpu_indices(settings, proc_dir, nvml=proc_dir == NVIDIA_PROC))


def place(raw: dict[str, Any], gpus: int, worker: str, limits: SpecLimits | None = None) -> dict[str, Any]:
    """The spec with ``nproc_per_node`` as this worker's number of ranks; raises PlacementError.

    ``"gpu"`` becomes ``gpus``. A job that would use GPUs (device auto or cuda on a worker with GPUs)
    must not ask for more ranks than there are GPUs. Once the number is known, the rules that depend
    on it (a global batch divisible by the ranks, a mesh that divides them) are checked again."""
    stored = StoredSpec.of(raw)
    nproc, device = stored.nproc_per_node, stored.device
    if nproc == "gpu":
        if gpus == 0:
            raise PlacementError(f"parallel.nproc_per_node: 'gpu' asks for one rank per GPU, but worker {worker} has no GPU")
        placed = copy.deepcopy(raw)
        placed.setdefault("parallel", {})["nproc_per_node"] = gpus
    else:
        placed = raw
    count = StoredSpec.of(placed).nproc_per_node
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
