"""Giving up the worker's rights in a child process: another uid, no groups, no capabilities, no new privileges.
Standard library only, so a short-lived helper (worker/mlflow_read.py) can import it without the worker's imports."""

from __future__ import annotations

import ctypes
import os

_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522

libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_to(uid: int, gid: int) -> None:
    """This process becomes ``uid``/``gid`` with no groups and no capabilities. Raises OSError on any failure."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    # From a non-root worker holding capabilities the kernel keeps them across setresuid: drop them all.
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.capget(ctypes.byref(header), data) != 0 or any(d.effective or d.permitted or d.inheritable for d in data):
        raise OSError(0, "capabilities survived the uid switch")
    if os.getuid() != uid or os.geteuid() != uid or os.getgroups():
        raise OSError(0, "uid switch incomplete")


def no_new_privs() -> None:
    """Setuid binaries and file capabilities cannot raise this process's rights from here on."""
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
