"""SIGTERM/SIGINT handling: every rank stops after the same step.

A signal only sets a flag. Once per step each rank contributes its flag to an all_reduce on a
separate gloo group of CPU tensors, issued asynchronously and read one step later: no device
synchronisation, no waiting in the hot loop, and all ranks read the same sum at the same step,
so they agree on where to stop. The cost is one extra step of latency after the signal.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class StopSignal:
    def __init__(self, world_size: int, group: Any = None):
        self.world_size = world_size
        self.group = group
        self.received = False
        self._work: Any = None
        self._buf = torch.zeros(1)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only set a flag: the handler may run in the middle of any Python code.
        self.received = True
        # A second Ctrl-C by hand should not wait for the checkpoint.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def should_stop(self) -> bool:
        """Called once per optimizer step on every rank; True on all ranks at the same step."""
        if self.world_size == 1:
            return self.received
        agreed = False
        if self._work is not None:
            self._work.wait()
            self._work = None
            agreed = bool(self._buf.item() > 0)
        if agreed:
            return True
        self._buf = torch.tensor([1.0 if self.received else 0.0])
        self._work = dist.all_reduce(self._buf, group=self.group, async_op=True)
        return False

    def close(self) -> None:
        """Complete the op still in flight, so every rank issued the same collectives before shutdown."""
        if self._work is not None:
            self._work.wait()
            self._work = None
