"""The quick selection (``-m "not slow"``) fails a test that starts torchrun, and a full run does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, inner_pytest_env

INNER = '''
import subprocess, sys
import pytest

def test_starts_torchrun():
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--help"], check=True, capture_output=True)

@pytest.mark.slow
def test_marked():
    pass
'''


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.torchrun_guard", "-p", "no:cacheprovider",
         "-o", "markers=slow", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=inner_pytest_env())  # only the guard under test


def test_the_quick_selection_fails_a_test_that_starts_torchrun(tmp_path: Path) -> None:
    quick = _pytest(tmp_path, "-m", "not slow")
    assert quick.returncode == 1, quick.stdout
    assert "test_starts_torchrun started torchrun in a run that leaves out slow tests" in quick.stdout
    assert "torch.distributed.run --help" in quick.stdout


def test_a_run_that_keeps_slow_tests_lets_torchrun_start(tmp_path: Path) -> None:
    full = _pytest(tmp_path)
    assert full.returncode == 0, full.stdout
