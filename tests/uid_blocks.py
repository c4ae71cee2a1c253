"""Job uids for the tests that run jobs as other users: a block of its own for each pytest process.

Those tests kill every process of the uids they use (a worker ends a uid before an attempt takes it, and the
isolation tests' teardown kills their whole range), so two pytest processes, xdist workers of one run or two
copies of the suite side by side, must never share one. A process takes the first block no other live process
holds, by an exclusive lock on the block's file in a directory every run on this machine shares; the lock goes
with the process, however it ends, so a killed run frees its block.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO

BASE = 33000  # above 20000-29999, the range `make run` and compose jobs take meanwhile
SIZE = 100
BLOCKS = 250  # up to uid 57999
# Shared by every run on the machine; a test of this module points its own processes elsewhere.
LOCKS = Path(os.environ.get("TORCHYARD_TEST_UID_LOCKS") or Path(tempfile.gettempdir()) / "torchyard-test-uid-blocks")

_held: dict[str, tuple[IO[str], tuple[int, int]]] = {}  # the locked file stays open for the process's life


def uid_block() -> tuple[int, int]:
    """This process's uid range (first, last), the same on every call."""
    if "block" in _held:
        return _held["block"][1]
    LOCKS.mkdir(exist_ok=True)
    for index in range(BLOCKS):
        lock = (LOCKS / f"{index}.lock").open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        block = (BASE + index * SIZE, BASE + (index + 1) * SIZE - 1)
        _held["block"] = (lock, block)
        return block
    raise RuntimeError(f"all {BLOCKS} job uid blocks under {LOCKS} are held by live test processes")
