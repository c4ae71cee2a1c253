"""Fault injection for chaos testing: make a chosen rank raise, hang or die at a chosen step.

``TORCHYARD_FAULTS`` holds a JSON list such as
``[{"action": "raise", "step": 5, "rank": 1, "restart": 0, "attempt": 1}]``. ``slow`` sleeps
``seconds`` after every step from ``step`` on, so a test has time to interfere mid-job. ``oom`` raises
``torch.OutOfMemoryError`` with CUDA's message, as a GPU running out of memory does. ``restart`` matches
torchrun's restart count inside an attempt and ``attempt`` the service's attempt number; leave
either out (null) to fire on every one. Unset in normal runs, where this costs one dict lookup.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

ENV = "TORCHYARD_FAULTS"


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    action: Literal["raise", "oom", "hang", "exit", "sigkill", "slow"]
    step: int
    rank: int = 0
    restart: int | None = 0
    attempt: int | None = 1
    code: int = 1
    seconds: float = 0.1


def _load() -> list[Fault]:
    raw = os.environ.get(ENV)
    if not raw:
        return []
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    attempt = int(os.environ.get("TORCHYARD_ATTEMPT", "1"))
    faults = [Fault(**item) for item in json.loads(raw)]
    return [f for f in faults if f.restart in (None, restart) and f.attempt in (None, attempt)]


_FAULTS = _load()


def at_step(step: int, rank: int) -> None:
    """Fire any fault planned for this rank at this step (called after each optimizer step)."""
    for fault in _FAULTS:
        if fault.action == "slow" and step >= fault.step:
            time.sleep(fault.seconds)
            continue
        if fault.step != step or fault.rank != rank:
            continue
        log.error("injected fault: %s at step %d on rank %d", fault.action, step, rank)
        if fault.action == "raise":
            raise InjectedFault(f"injected fault at step {step} on rank {rank}")
        if fault.action == "oom":
            import torch

            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected at step {step} on rank {rank})")
        if fault.action == "exit":
            os._exit(fault.code)
        if fault.action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        while fault.action == "hang":
            time.sleep(3600)
