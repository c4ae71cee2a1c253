"""The processes ``python -m stack`` keeps running: started in sessions of their own, restarted with a backoff when
they exit, stopped together."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobspec.pdeathsig import set_parent_death_signal

log = logging.getLogger("torchyard.stack")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A child that ran this long before exiting starts again after FIRST_BACKOFF_S: it was not crash-looping.
STABLE_AFTER_S = 60.0


def _detach() -> None:
    # Runs in the child between fork and exec: if the stack itself is killed, its children stop too.
    set_parent_death_signal(signal.SIGTERM)


def next_backoff(previous_s: float, uptime_s: float) -> float:
    """The wait before restarting a child that exited after ``uptime_s``, given the wait before its last restart."""
    if previous_s <= 0 or uptime_s >= STABLE_AFTER_S:
        return FIRST_BACKOFF_S
    return min(previous_s * 2, MAX_BACKOFF_S)


@dataclass
class Child:
    """One process (the API, a worker), restarted by ``tend`` whenever it exits."""

    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0
    restart_at: float | None = field(default=None)

    def start(self) -> None:
        # A session of its own: a terminal's Ctrl+C reaches the stack alone, which then sends each child one
        # SIGTERM (a second signal would turn the worker's warm shutdown into a cold one).
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_detach)  # noqa: PLW1509 - the stack starts no threads
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tend(self, now: float) -> None:
        """Notice an exit and schedule a restart; start again once the backoff has passed."""
        if self.proc is None:
            return
        if self.restart_at is None:
            code = self.proc.poll()
            if code is None:
                return
            uptime = now - self.started_at
            self.backoff_s = next_backoff(self.backoff_s, uptime)
            self.restart_at = now + self.backoff_s
            how = f"signal {-code}" if code < 0 else f"code {code}"
            log.warning("%s (pid %d) exited with %s after %.0f s; restarting it in %.0f s",
                        self.name, self.proc.pid, how, uptime, self.backoff_s)
        elif now >= self.restart_at:
            self.restarts += 1
            self.start()
            log.warning("%s restarted (pid %d, restart %d)", self.name, self.proc.pid, self.restarts)


def stop_all(children: list[Child], grace_s: float, forced: Callable[[], bool]) -> None:
    """SIGTERM to every running child, then wait ``grace_s`` for all (a worker preempts its job and requeues it);
    SIGKILL what is left, or everything as soon as ``forced()`` is true (a second Ctrl+C)."""
    for child in children:
        if child.running():
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(c.running() for c in children):
        if time.monotonic() > deadline or forced():
            for child in children:
                if child.running():
                    assert child.proc is not None
                    log.warning("%s (pid %d) did not stop; killing it", child.name, child.proc.pid)
                    child.proc.kill()
            break
        time.sleep(0.1)
    for child in children:
        if child.proc is not None:
            child.proc.wait()
