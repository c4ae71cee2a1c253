"""What a rank's process and GPU are doing, sampled at the log cadence but at most once a second: ``sys/cpu_percent`` and
``sys/rss_bytes`` everywhere (psutil), ``sys/gpu_util``, ``sys/gpu_mem_used`` and ``sys/gpu_mem_total``
through NVML (nvidia-ml-py, via torch.cuda's NVML helpers, which map CUDA_VISIBLE_DEVICES) on a GPU.

Each sample is a handful of syscalls and NVML queries, never a CUDA synchronisation. At most once a second,
because reports come every few milliseconds on a small model (every 10 steps of 3.5 ms on the benchmark's MLP)
and there two psutil reads per report cost each rank about 0.2 ms under load; between samples a report
carries the last one.
"""

from __future__ import annotations

import logging
import math
import time

import psutil
import torch

log = logging.getLogger(__name__)

CPU_NAMES = ("sys/cpu_percent", "sys/rss_bytes")
GPU_NAMES = ("sys/gpu_util", "sys/gpu_mem_used", "sys/gpu_mem_total")
MIN_INTERVAL_S = 1.0


class SystemSampler:
    """Samples this process (and its GPU, on CUDA); ``names`` is the same on every rank of a job."""

    def __init__(self, device: torch.device, min_interval_s: float = MIN_INTERVAL_S):
        self.device = device
        self.min_interval_s = min_interval_s
        self._last: list[float] | None = None
        self._last_at = 0.0
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call only starts the interval
        self._nvml = device.type == "cuda"
        self.names = CPU_NAMES + (GPU_NAMES if self._nvml else ())
        self._gpu_total = float(torch.cuda.get_device_properties(device).total_memory) if self._nvml else math.nan

    @property
    def rss_bytes(self) -> float:
        """This process's resident memory at the last sample."""
        return self.sample()[CPU_NAMES.index("sys/rss_bytes")]

    def sample(self) -> list[float]:
        """One value per name; NaN where a value cannot be read (NVML missing or failing). The last sample
        again when it is under ``min_interval_s`` old."""
        now = time.monotonic()
        if self._last is None or now - self._last_at >= self.min_interval_s:
            self._last, self._last_at = self._read(), now
        return self._last

    def _read(self) -> list[float]:
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
