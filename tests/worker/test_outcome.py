"""A failed attempt's error names the failing rank's own exit code, read from torchrun's launcher log
(recorded from torch 2.13's torchrun: rank 1 of 2 ran ``sys.exit(2)``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def _rank_dir(log_dir: Path, local: int, written_ns: int, message: str) -> Path:
    rank_dir = log_dir / "run-1" / "attempt_0" / str(local)
    rank_dir.mkdir(parents=True)
    (rank_dir / "rank").write_text(str(local))
    error = rank_dir / "error.json"
    error.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": f"Traceback of {local}"}}}))
    os.utime(error, ns=(written_ns, written_ns))
    return rank_dir


@pytest.mark.parametrize("rank_1_first", [True, False])
def test_the_rank_that_failed_first_is_named_whichever_torchrun_names(launcher_log: Path, rank_1_first: bool) -> None:
    """Rank 1 raised; rank 0 failed on its closed connection a moment later, and torchrun named rank 0 (as its fork
    path does, the lowest local rank found dead). Each error file says when its rank failed."""
    log_dir = launcher_log.parent
    now = time.time_ns()
    peer = _rank_dir(log_dir, 0, now if rank_1_first else now - 10**6, "RuntimeError: Connection closed by peer")
    _rank_dir(log_dir, 1, now - 10**6 if rank_1_first else now, "InjectedFault: rank 1 raised at step 3")
    named = launcher_log.read_text().replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)").replace(
        "error_file: <N/A>", f"error_file: {peer / 'error.json'}")
    launcher_log.write_text(named)
    (log_dir / "error.json").write_text((peer / "error.json").read_text())  # torchrun's copy of the rank it named
    found = outcome.failure(1, log_dir / "error.json", launcher_log)
    if rank_1_first:
        assert (found.rank, found.message, found.traceback) == (1, "rank 1: InjectedFault: rank 1 raised at step 3",
                                                                "Traceback of 1")
    else:
        assert (found.rank, found.message) == (0, "rank 0: RuntimeError: Connection closed by peer")


@given(st.dictionaries(st.sampled_from(["0", "1", "2", "3", "10", "x"]), st.integers(0, 5), min_size=0, max_size=6))
def test_first_written_is_the_earliest_file_and_ties_go_to_the_lowest_local_rank(written: dict[str, int]) -> None:
    first = outcome.first_written(written)
    if not written:
        assert first is None
        return
    assert first is not None and written[first] == min(written.values())
    tied = [name for name, at in written.items() if at == written[first]]
    numbered = sorted(int(n) for n in tied if n.isdigit())
    assert first == (str(numbered[0]) if numbered else "x")
    assert outcome.first_written(dict(reversed(written.items()))) == first  # the order files are listed in never matters


def _failure(traceback: bool, written_ns: int | None) -> outcome.Failure:
    return outcome.Failure(outcome.ErrorType.TRAINING, "m", "Traceback" if traceback else None, 1, written_ns=written_ns)


@given(st.lists(st.tuples(st.booleans(), st.none() | st.integers(0, 3)), max_size=5))
def test_the_first_node_to_fail_is_the_earliest_written_traceback(nodes: list[tuple[bool, int | None]]) -> None:
    failures = [_failure(*node) for node in nodes]
    first = outcome.first_of_nodes(failures)
    told = [f for f in failures if f.traceback is not None]
    if not told:
        assert first is None
        return
    assert first is not None and first.traceback is not None
    timed = [f.written_ns for f in told if f.written_ns is not None]
    if timed:
        assert first.written_ns == min(timed)  # before any node whose rank left no write time
    # ties go to the lower node: node 0's own failure before a follower's
    index = next(i for i, f in enumerate(failures) if f is first)
    assert not any(f.traceback is not None and f.written_ns == first.written_ns for f in failures[:index])
