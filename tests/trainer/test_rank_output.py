"""A rank's output as printed, under real torchrun with ``--redirects=3``: stdout and stderr interleaved in
the order written, per-stream copies, the node's merged log with rank prefixes, and nothing lost when a
rank dies of a Python exception or of a native crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobspec.rank_logs import OUTPUT_LOG, find_rank_dir
from stack.redis_server import free_port
from tests.helpers import ROOT

pytestmark = pytest.mark.slow

SCRIPT = """
import ctypes, os, signal, sys, time
print("out 1")
sys.stderr.write("err 1\\n")
print("out 2", end="")
sys.stderr.write(" and err 2 on the same line\\n")
os.write(1, b"native write to fd 1\\n")
# Rank 1 dies first, and rank 0 raises when torchrun stops it for that: torchrun stops the survivors of a failed
# rank, so two ranks that each fail on their own race it, and a loaded host lets torchrun's SIGTERM reach rank 0
# before its traceback is written. Rank 1 waits for rank 0's lines so that neither is stopped before it has written.
rank = os.environ["RANK"]
if rank == "0":
    def stopped(signum, frame):
        raise RuntimeError("boom on rank 0")
    signal.signal(signal.SIGTERM, stopped)  # before rank 1 can know rank 0 has written, and so before it dies
open(f"wrote-{rank}", "w").close()
deadline = time.monotonic() + 120
if rank == "0":
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("boom on rank 0")
while not os.path.exists("wrote-0") and time.monotonic() < deadline:
    time.sleep(0.01)
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


def test_a_global_ranks_logs_are_found_on_the_second_node(tmp_path: Path) -> None:
    """Two torchrun agents (two nodes of one rank each) share a log directory, as the nodes of a multi-node job
    do on the runs volume: both name their rank's directory ``0``, and global rank 1 is node 1's local rank 0."""
    (tmp_path / "hello.py").write_text("import os\nprint('I am global rank', os.environ['RANK'])\n")
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    port = free_port()
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                                "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                                "--rdzv-id=two-nodes", f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
                                f"--log-dir={logs}", "--redirects=3",
                                "-m", "trainer.rank_bootstrap", str(tmp_path), "file", str(tmp_path / "hello.py")],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for node in (0, 1)]
    assert [agent.wait(timeout=240) for agent in agents] == [0, 0]
    assert sorted(p.name for p in logs.glob("*/attempt_0/*")) == ["0", "0"]  # both nodes call their rank "0"
    for rank in (0, 1):
        found = find_rank_dir(logs, rank)
        assert found is not None
        assert f"I am global rank {rank}" in (found / OUTPUT_LOG).read_text()
    assert find_rank_dir(logs, 2) is None
