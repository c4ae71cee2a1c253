"""Linux process controls (prctl), torch-free so the worker, the API and the trainer share them:
the parent-death signal, and keeping a service process's memory and environment from its jobs."""

from __future__ import annotations

import ctypes
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    return libc.prctl(option, arg, 0, 0, 0) == 0


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies. False where that
    cannot be done (not Linux, no glibc): the caller decides whether that matters."""
    return _prctl(_PR_SET_PDEATHSIG, sig)


def set_not_dumpable() -> bool:
    """Make this process non-dumpable: ``/proc/<pid>/environ``, ``mem`` and ptrace are then closed to
    other processes of the same user, such as the jobs a worker runs, which would otherwise read the
    service's database URL, tokens and secrets key there. Children that exec a program are dumpable
    again, so job processes stay inspectable by the worker. False where it cannot be done."""
    return _prctl(_PR_SET_DUMPABLE, 0)
