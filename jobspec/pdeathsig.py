"""Linux process controls (prctl), torch-free so the worker, the API and the trainer share them:
the parent-death signal, and keeping a service process's memory and environment from its jobs."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4

# Marks the worker sets on torchrun and so on every rank it starts (worker/launch.py): a rank's true parent has them.
PARENT_MARKS = ("TORCHYARD_JOB_ID", "TORCHYARD_ATTEMPT")
ORPHAN_EXIT_CODE = 1


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


def parent_gone(ppid: int, environ: Mapping[str, str], parent_environ: bytes | None) -> bool:
    """Whether a rank's launcher already died: its parent is not the process that started it. A rank the worker
    started carries the attempt's marks, as its torchrun does; a parent without the same marks (init, or a
    subreaper the rank was handed to) is not its torchrun. ``parent_environ`` is the parent's
    ``/proc/PID/environ``, None where it cannot be read: then only a parent of pid 1 says the launcher is gone.
    A process started without the marks (by hand, not by a worker) is never judged orphaned."""
    marks = [f"{name}={environ[name]}".encode() for name in PARENT_MARKS if name in environ]
    if len(marks) < len(PARENT_MARKS):
        return False
    if parent_environ is None:
        return ppid == 1
    return not set(marks) <= set(parent_environ.split(b"\0"))


def _environ_of(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def die_with_parent() -> None:
    """First thing in a rank: SIGKILL when torchrun dies; and exit now if it died already, between starting
    this rank and this call, when the kernel had no parent left to watch. Torch-free and quick, so that window
    is an interpreter's start, not torch's import."""
    if not sys.platform.startswith("linux"):
        return
    if not set_parent_death_signal(signal.SIGKILL):
        sys.stderr.write("torchyard: cannot set the parent-death signal; a killed torchrun may leave this rank running\n")
        return
    ppid = os.getppid()  # after the prctl: a parent that dies from here on is signalled, one before has changed this
    if parent_gone(ppid, os.environ, _environ_of(ppid)):
        sys.stderr.write(f"torchyard: this rank's launcher is gone (parent now pid {ppid}); exiting\n")
        os._exit(ORPHAN_EXIT_CODE)
