"""A rank's output as printed, under real torchrun with ``--redirects=3``: stdout and stderr interleaved in
the order written, per-stream copies, the node's merged log with rank prefixes, and nothing lost when a
rank dies of a Python exception or of a native crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow

SCRIPT = """
import ctypes, os, sys
print("out 1")
sys.stderr.write("err 1\\n")
print("out 2", end="")
sys.stderr.write(" and err 2 on the same line\\n")
os.write(1, b"native write to fd 1\\n")
if os.environ["RANK"] == "0":
    raise RuntimeError("boom on rank 0")
ctypes.string_at(0)  # rank 1: a segmentation fault; faulthandler's report is all that is left of it
"""


def test_ranks_output_is_interleaved_merged_and_survives_crashes(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(SCRIPT)
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           f"--log-dir={logs}", "--redirects=3",
                           "-m", "trainer.rank_bootstrap", str(tmp_path), "file", str(tmp_path / "crash.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    rank0, rank1 = (next(logs.glob(f"*/attempt_0/{r}")) for r in (0, 1))

    out0 = (rank0 / "output.log").read_text().splitlines()
    assert out0[:4] == ["out 1", "err 1", "out 2 and err 2 on the same line", "native write to fd 1"]
    assert "Traceback (most recent call last):" in out0 and out0[-1] == "RuntimeError: boom on rank 0"
    # The per-stream copies hold what Python wrote to each stream (native writes are only in output.log).
    assert (rank0 / "stdout.log").read_text() == "out 1\nout 2"
    stderr0 = (rank0 / "stderr.log").read_text()
    assert stderr0.startswith("err 1\n and err 2 on the same line\n") and "RuntimeError: boom on rank 0" in stderr0

    out1 = (rank1 / "output.log").read_text()
    assert out1.startswith("out 1\nerr 1\n") and "Fatal Python error: Segmentation fault" in out1

    merged = (logs / "ranks.log").read_text().splitlines()
    for r in (0, 1):
        mine = [line.removeprefix(f"[rank {r}] ") for line in merged if line.startswith(f"[rank {r}] ")]
        assert mine[:3] == ["out 1", "err 1", "out 2 and err 2 on the same line"]
    assert "[rank 0] RuntimeError: boom on rank 0" in merged
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in merged)
