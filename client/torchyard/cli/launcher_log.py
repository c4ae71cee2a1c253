"""torchrun's own log, with the traceback of an expected stop folded into one line.

When torchyard stops an attempt (a cancel, a timeout, a preemption) it sends torchrun SIGTERM, and
torchrun answers with a full traceback ending in ``SignalException: Process N got signal: 15``. That
reads like a crash; for a stop the user asked for (or the service made) it says nothing else.
"""

from __future__ import annotations

import re
import signal

_SIGNALLED = re.compile(r"^\S*SignalException: Process \d+ got signal: (\d+)\s*$")
_TRACEBACK = "Traceback (most recent call last):"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def fold_expected_stop(text: str, why: str) -> str:
    """``text`` with each traceback that ends in torchrun's SignalException replaced by one line naming
    the signal and ``why`` ("the job was cancelled"); every other line as it was."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    start: int | None = None  # index in out of the traceback being read, if any
    for line in lines:
        if line.rstrip("\n") == _TRACEBACK:
            start = len(out)
        match = _SIGNALLED.match(line.rstrip("\n"))
        if match and start is not None:
            del out[start:]
            name = _signal_name(int(match.group(1)))
            out.append(f"[torchyard] torchrun stopped by {name} because {why}; "
                       f"the SignalException traceback it prints then is expected and folded here\n")
            start = None
            continue
        out.append(line)
    return "".join(out)


def expected_stop(status: str, error_type: str | None, attempt: int | None, current_attempt: int) -> str | None:
    """Why torchyard itself stopped torchrun in this attempt, or None when a signal there was not expected."""
    if attempt is not None and attempt < current_attempt:
        return f"attempt {attempt} was stopped by the service (a later attempt followed)"
    if status in ("cancelled", "cancelling"):
        return "the job was cancelled"
    if error_type in ("timeout", "preempted", "stalled"):
        return f"the job was stopped ({error_type})"
    return None
