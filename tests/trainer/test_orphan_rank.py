"""A rank whose torchrun died while the rank was starting exits at once, before any of its work: the kernel's
parent-death signal only watches a parent that is still alive when it is set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT, wait_until

# A launcher that starts its "rank" and exits at once. The rank (a shell standing in for the interpreter's start)
# waits until the launcher is gone, then execs the real entry: the rank starts after its parent died, every time.
LAUNCHER = """
import os, subprocess, sys
out = open(sys.argv[1], "ab")
rank = subprocess.Popen(["sh", "-c", 'p=$1; shift; while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; exec "$@"',
                         "sh", str(os.getpid()), *sys.argv[2:]], stdout=out, stderr=out, start_new_session=True)
print(rank.pid)
"""


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("entry", ["script", "catalog"])
def test_a_rank_started_after_its_launcher_died_exits_before_running(tmp_path: Path, entry: str) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "script.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (tmp_path / "spec.json").write_text("{}")
    rank = (["-m", "trainer.rank_bootstrap", str(tmp_path), "file", str(tmp_path / "script.py")] if entry == "script"
            else ["-m", "trainer", "--spec", str(tmp_path / "spec.json"), "--run-dir", str(tmp_path / "run")])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1",
           "TORCHYARD_JOB_ID": "j1", "TORCHYARD_ATTEMPT": "1"}  # what the worker marks torchrun and its ranks with
    log = tmp_path / "rank.log"
    launched = subprocess.run([sys.executable, "-c", LAUNCHER, str(log), sys.executable, *rank],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    pid = int(launched.stdout)
    wait_until(lambda: _ended(pid), 120, what="the orphaned rank to end")
    assert "this rank's launcher is gone" in log.read_text()
    assert not marker.exists()
