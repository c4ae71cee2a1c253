"""Where a job's ``torch.compile`` caches live (TorchInductor's and Triton's): per owner on a host, never shared
between owners.

A compile cache holds code that the next job executes, so a cache shared with another tenant would let that
tenant run code in this one's job. Torch's default (``/tmp/torchinductor_$USER``) is one directory per user
name, and every job inherits the worker's: under leased uids it is created by whichever job came first and
read by all. Instead:

* one owner per uid over time (the worker runs only the first owner's jobs as its own user): one directory
  per owner, reused by each of its jobs on this host, which is what makes a warm start warm;
* leased uids (``TORCHYARD_JOB_UIDS``): one per owner and uid, owned by that uid with mode 0700, under a root
  (mode 0711) whose entries cannot be listed and whose names are keyed digests (a host salt readable only by
  the worker): a later job of another owner under the same uid cannot find the directory;
* every owner as the worker's user (``TORCHYARD_SINGLE_USER``): nothing is private to one owner, so each job
  gets its own cache in its run directory (cold every time).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from jobs.settings import Settings
from worker.sandbox.job_users import JobIdentity, isolation_mode

ROOT_NAME = ".compile-cache"
_SALT = ".salt"


def cache_name(salt: bytes, owner: str, uid: int | None) -> str:
    """The directory of ``owner``'s caches (under ``uid``, when jobs run under leased uids): a keyed digest, so
    neither the owner's name nor the directories of others can be read off it."""
    return hashlib.sha256(salt + f"\0{owner}\0{'' if uid is None else uid}".encode()).hexdigest()[:32]


def _salt(root: Path) -> bytes:
    path = root / _SALT
    try:
        return path.read_bytes()
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # two workers on a host: the first wins
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        return path.read_bytes()


def compile_cache_env(settings: Settings, owner: str, identity: JobIdentity | None, run_dir: Path) -> dict[str, str]:
    """``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` for an attempt's ranks; creates the directory."""
    if identity is None and not isolation_mode(settings).one_owner:
        base = run_dir / ROOT_NAME
        base.mkdir(parents=True, exist_ok=True)
    else:
        root = settings.runs_dir / ROOT_NAME
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)  # entries can be reached by name, not listed
        base = root / cache_name(_salt(root), owner, identity.uid if identity else None)
        base.mkdir(mode=0o700, exist_ok=True)
        if identity is not None and base.stat().st_uid != identity.uid:
            os.chown(base, identity.uid, identity.gid)
    return {"TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"), "TRITON_CACHE_DIR": str(base / "triton")}
