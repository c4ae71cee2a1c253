"""What a rank's process and GPU are doing, sampled at the log cadence: ``sys/cpu_percent`` and
``sys/rss_bytes`` everywhere (psutil), ``sys/gpu_util``, ``sys/gpu_mem_used`` and ``sys/gpu_mem_total``
through NVML (nvidia-ml-py, via torch.cuda's NVML helpers, which map CUDA_VISIBLE_DEVICES) on a GPU.

Each sample is a handful of syscalls and NVML queries, never a CUDA synchronisation.
"""

from __future__ import annotations

import logging
import math

import psutil
import torch

log = logging.getLogger(__name__)

CPU_NAMES = ("sys/cpu_percent", "sys/rss_bytes")
GPU_NAMES = ("sys/gpu_util", "sys/gpu_mem_used", "sys/gpu_mem_total")


class SystemSampler:
    """Samples this process (and its GPU, on CUDA); ``names`` is the same on every rank of a job."""

    def __init__(self, device: torch.device):
        self.device = device
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call only starts the interval
        self._nvml = device.type == "cuda"
        self.names = CPU_NAMES + (GPU_NAMES if self._nvml else ())
        self._gpu_total = float(torch.cuda.get_device_properties(device).total_memory) if self._nvml else math.nan

    def sample(self) -> list[float]:
        """One value per name; NaN where a value cannot be read (NVML missing or failing)."""
        values = [self._proc.cpu_percent(None), float(self._proc.memory_info().rss)]
        if self._nvml:
            try:
                values += [float(torch.cuda.utilization(self.device)), float(torch.cuda.device_memory_used(self.device)),
                           self._gpu_total]
            except Exception as exc:  # noqa: BLE001 - no nvidia-ml-py or no NVML: report what psutil has
                log.warning("GPU metrics unavailable (%s); only CPU metrics are reported", exc)
                self._nvml = False
                values += [math.nan] * len(GPU_NAMES)
            return values
        return values + [math.nan] * (len(self.names) - len(values))
