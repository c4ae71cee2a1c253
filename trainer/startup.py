"""Where a rank's start-up goes, by phase: from the process's start (the interpreter and its imports) to the
end of the first optimizer step. Rank 0 logs one ``startup`` line with the phases after the first step, and
the ``training`` status event carries those known by then, so a slow first step can be read by phase.

Phases are host times. The first step's are host times too (no device sync is added for them): with
``train.compile`` its forward is where the blocks are compiled, which is host work.
"""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger(__name__)


def _process_start() -> float:
    """When this process started (wall clock); now if that cannot be read."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - the phases are a diagnostic; without the start time "imports" is just 0
        return time.time()


class Phases:
    """Ordered phases; ``mark(name)`` closes the phase that ran since the previous mark."""

    def __init__(self, started: float | None = None):
        self.started = _process_start() if started is None else started
        self._last = self.started
        self.seconds: dict[str, float] = {}
        self.done = False  # logged: a later job in the same process (the tests' run_cases) starts anew

    def mark(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 3)
        self._last = now

    def since_start(self) -> float:
        return round(self._last - self.started, 3)

    def as_dict(self) -> dict[str, float]:
        return {**self.seconds, "since_process_start_s": self.since_start(), "process_started_at": round(self.started, 3)}

    def log(self, what: str) -> None:
        # One line, JSON after the colon: bench/gpu.py reads it back from the rank's log.
        log.info("startup %s: %s", what, json.dumps(self.as_dict()))
        self.done = True


# This process's phases; __main__ marks the first two, loop.run the rest.
PHASES = Phases()


def current() -> Phases:
    """The process's phases, or fresh ones from now when an earlier job in this process already logged its own."""
    global PHASES
    if PHASES.done:
        PHASES = Phases(started=time.time())
    return PHASES
