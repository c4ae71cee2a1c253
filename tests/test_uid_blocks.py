"""Two pytest processes on one machine (xdist workers, or two copies of the suite) never get the same job uids;
a process that ends, however it ends, frees its block for the next."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.uid_blocks import BASE, SIZE, uid_block

TAKE = "from tests.uid_blocks import uid_block; print(*uid_block(), flush=True); import sys; sys.stdin.read()"


def _holder(locks: Path) -> tuple[subprocess.Popen[str], tuple[int, int]]:
    # Their own lock directory: another run on the machine cannot take a block between the steps below.
    proc = subprocess.Popen([sys.executable, "-c", TAKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TORCHYARD_TEST_UID_LOCKS": str(locks)})
    assert proc.stdout is not None
    first, last = map(int, proc.stdout.readline().split())
    return proc, (first, last)


def test_this_process_keeps_one_block_of_its_own() -> None:
    mine = uid_block()
    assert uid_block() == mine and mine[0] >= BASE and mine[1] - mine[0] == SIZE - 1 and (mine[0] - BASE) % SIZE == 0


def test_live_processes_hold_distinct_blocks_and_a_killed_one_frees_its_own(tmp_path: Path) -> None:
    a, block_a = _holder(tmp_path)
    b, block_b = _holder(tmp_path)
    try:
        assert (block_a, block_b) == ((BASE, BASE + SIZE - 1), (BASE + SIZE, BASE + 2 * SIZE - 1))
        a.kill()
        a.wait(timeout=60)
        c, block_c = _holder(tmp_path)
        c.kill()
        c.wait(timeout=60)
        assert block_c == block_a  # the first block again: its holder died without letting go of it
    finally:
        for proc in (a, b):
            proc.kill()
            proc.wait(timeout=60)
