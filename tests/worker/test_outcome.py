"""A failed attempt's error names the failing rank's own exit code, read from torchrun's launcher log
(recorded from torch 2.13's torchrun: rank 1 of 2 ran ``sys.exit(2)``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker import outcome

DATA = Path(__file__).parent / "data"


@pytest.fixture
def launcher_log(tmp_path: Path) -> Path:
    log = tmp_path / "logs" / "attempt-1" / "launcher.log"
    log.parent.mkdir(parents=True)
    log.write_text((DATA / "launcher-rank-exit-2.log").read_text())
    return log


def test_the_error_names_the_failing_ranks_exit_code_and_torchruns(launcher_log: Path) -> None:
    found = outcome.failure(1, launcher_log.parent / "error.json", launcher_log)
    assert found.message == "rank 1 exited with code 2; torchrun exited with code 1"
    assert (found.rank, found.exit_code) == (1, 1)


def test_a_rank_killed_by_a_signal_says_which(launcher_log: Path) -> None:
    launcher_log.write_text(launcher_log.read_text().replace("exitcode  : 2 (pid: 2135)", "exitcode  : -9 (pid: 2135)"))
    assert outcome.failure(1, launcher_log.parent / "error.json", launcher_log).message == (
        "rank 1 was killed by SIGKILL; torchrun exited with code 1")


def test_an_exception_message_from_the_error_file_stays_the_summary(launcher_log: Path) -> None:
    error_file = launcher_log.parent / "error.json"
    error_file.write_text('{"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback ..."}}}')
    found = outcome.failure(1, error_file, launcher_log)
    assert found.message == "rank 1: ValueError: bad batch" and found.traceback == "Traceback ..."
