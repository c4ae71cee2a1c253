"""Folding torchrun's traceback of an expected stop: only that traceback goes, every other line stays."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from torchyard.cli.launcher_log import expected_stop, fold_expected_stop

SIGTERM_LOG = (Path(__file__).parent / "data" / "launcher-sigterm.log").read_text()
TRACEBACK = SIGTERM_LOG[SIGTERM_LOG.index("Traceback (most recent call last):"):]
lines = st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40).filter(lambda s: "Traceback" not in s
                                                                                               and "SignalException" not in s), max_size=6)


@given(before=lines, after=lines)
def test_only_the_signal_traceback_is_folded(before: list[str], after: list[str]) -> None:
    head = "".join(f"{line}\n" for line in before)
    tail = "".join(f"{line}\n" for line in after)
    folded = fold_expected_stop(head + TRACEBACK.rstrip("\n") + "\n" + tail, "the job was cancelled")
    note = ("[torchyard] torchrun stopped by SIGTERM because the job was cancelled; "
            "the SignalException traceback it prints then is expected and folded here\n")
    assert folded == head + note + tail
    assert fold_expected_stop(head + tail, "the job was cancelled") == head + tail


def test_another_traceback_is_left_whole() -> None:
    crash = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n"
    assert fold_expected_stop(crash, "the job was cancelled") == crash


def test_a_stop_is_expected_only_when_the_service_made_it() -> None:
    assert expected_stop("cancelled", None, None, 1) == "the job was cancelled"
    assert expected_stop("failed", "timeout", None, 1) == "the job was stopped (timeout)"
    assert expected_stop("running", None, 1, 2) is not None  # an earlier attempt, ended by the service
    assert expected_stop("failed", "training_error", None, 1) is None
    assert expected_stop("running", None, None, 1) is None
