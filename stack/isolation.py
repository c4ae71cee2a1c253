"""How the local stack's worker runs jobs: each under a uid of its own where it can, else as the user who ran the
stack, said once in the ready block. The operator's own TORCHYARD_JOB_UIDS or TORCHYARD_SINGLE_USER always win."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

DEFAULT_JOB_UIDS = "20000-29999"


def reachable_by_others(path: Path) -> bool:
    """Every directory from / down to ``path`` lets other uids through (o+x): a job uid can get there."""
    try:
        return all(stat.S_IMODE(p.stat().st_mode) & 0o001 for p in [path, *path.parents] if p.is_dir())
    except OSError:
        return False


def choose(environ: Mapping[str, str], code: Path) -> tuple[dict[str, str], str]:
    """(settings to add to the children's environment, the line that says what jobs run as)."""
    if environ.get("TORCHYARD_JOB_UIDS"):
        return {}, f"jobs run under uids {environ['TORCHYARD_JOB_UIDS']} (TORCHYARD_JOB_UIDS)"
    if environ.get("TORCHYARD_SINGLE_USER"):
        return {}, f"TORCHYARD_SINGLE_USER={environ['TORCHYARD_SINGLE_USER']} as set"
    # A job uid must be able to start the interpreter and read torchyard's code; pyenv under /root is 0700.
    needed = [Path(os.path.realpath(sys.executable)).parent, Path(sys.prefix), code]
    if os.geteuid() == 0 and all(reachable_by_others(p) for p in needed):
        return {"TORCHYARD_JOB_UIDS": DEFAULT_JOB_UIDS}, f"each job runs under a uid of its own ({DEFAULT_JOB_UIDS})"
    why = "not root" if os.geteuid() != 0 else "the interpreter or torchyard's code is not reachable by other uids"
    return {"TORCHYARD_SINGLE_USER": "true"}, (
        f"jobs run as uid {os.geteuid()} ({why}): every owner's jobs can read each other's files; "
        "for separate tenants run it as root with TORCHYARD_JOB_UIDS (docs/security.md)")
