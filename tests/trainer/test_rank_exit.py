"""A script rank whose code returned ends as ``python`` would have (its exit status, its atexit handlers, its
output), even when something in the interpreter's teardown would abort it: the gloo threads that abort a finished
rank with SIGABRT at exit are stood in for by an object whose finaliser aborts."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

ABORTS_IN_TEARDOWN = '''
import atexit, os, sys, threading, time

class Teardown:
    def __del__(self):
        os.abort()  # what gloo's threads do to a finished rank during finalisation

keep = Teardown()
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
print("script done", flush=True)
sys.exit(int(sys.argv[1]))
'''


def _run(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "script.py").write_text(code)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1"}
    return subprocess.run([sys.executable, "-m", "trainer.rank_bootstrap", str(tmp_path), "file", str(tmp_path / "script.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_plain_python_aborts_in_teardown(tmp_path: Path) -> None:
    """The stand-in really aborts a rank when the interpreter tears down (the failure the bootstrap prevents)."""
    (tmp_path / "script.py").write_text(ABORTS_IN_TEARDOWN)
    done = subprocess.run([sys.executable, str(tmp_path / "script.py"), "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGABRT


@pytest.mark.parametrize("status", [0, 3])
def test_a_finished_script_keeps_its_exit_status_threads_and_atexit(tmp_path: Path, status: int) -> None:
    done = _run(tmp_path, ABORTS_IN_TEARDOWN, str(status))
    assert done.returncode == status, done.stderr
    assert done.stdout.splitlines() == ["script done", "thread finished", "atexit ran"]


def test_an_exception_still_fails_with_its_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, "raise ValueError('broken input')\n")
    assert done.returncode == 1
    assert "ValueError: broken input" in done.stderr


def test_a_message_exit_is_printed_and_fails(tmp_path: Path) -> None:
    done = _run(tmp_path, "import sys\nsys.exit('no data found')\n")
    assert done.returncode == 1
    assert "no data found" in done.stderr
