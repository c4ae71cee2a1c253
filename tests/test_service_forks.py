"""The fork server the tests start services through (tests/service_forks.py): a fork runs its module as ``python -m``
would, with the test's arguments, environment, working directory and log file, in a session of its own, and its
Popen reports what the process did: its exit code, the signal that killed it, a wait that timed out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests import service_forks
from tests.helpers import ROOT


def _env(**extra: str) -> dict[str, str]:
    return {**service_forks._server_env(), **extra}


def _seen(log: Path) -> dict[str, object]:
    return json.loads(log.read_text().splitlines()[0])


def test_a_fork_runs_its_module_with_the_tests_arguments_environment_and_log(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    proc = service_forks.SERVER.spawn(["tests.fork_probe", "3"], _env(PROBE="mine"), tmp_path, log)
    assert proc.wait(timeout=60) == 3 and proc.poll() == 3
    assert _seen(log) == {"argv": ["3"], "cwd": str(tmp_path), "probe": "mine", "session": True, "stdin": ""}


def test_a_fork_killed_by_a_signal_reports_it_and_a_wait_can_time_out(tmp_path: Path) -> None:
    proc = service_forks.SERVER.spawn(["tests.fork_probe", "0", "600"], _env(), ROOT, tmp_path / "probe.log")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)  # reaped by the server: no zombie left for psutil to wait on


def test_a_worker_or_a_service_with_its_own_interpreter_settings_or_a_wrapper_is_started_as_python_m(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_forks, "ENABLED", False)  # TORCHYARD_TEST_FORK_SERVICES=0
    assert not service_forks.usable("api", [], _env())
    monkeypatch.setattr(service_forks, "ENABLED", True)  # the default
    assert service_forks.usable("api", [], _env(TORCHYARD_ANY="x"))
    assert not service_forks.usable("worker", [], _env())
    assert not service_forks.usable("api", [], _env(PYTHONPATH=str(ROOT)))
    assert not service_forks.usable("api", [], _env(PYTHONWARNINGS="error::ResourceWarning"))
    assert not service_forks.usable("api", ["setpriv", "--reuid", "65534"], _env())
