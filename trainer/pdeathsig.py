"""The Linux parent-death signal, torch-free so the worker and the trainer share it."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies. False where that
    cannot be done (not Linux, no glibc): the caller decides whether that matters."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
