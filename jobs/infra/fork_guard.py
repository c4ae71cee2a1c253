"""Forking a process whose other threads use SQLite.

SQLite records the locks of every connection a process has to a database file in per-process bookkeeping, and
a forked child inherits it. A child forked while another thread of its parent held the write lock starts with
that lock recorded as held by a connection it has no way to release: each of its own writes waits out the busy
timeout and fails with "database is locked". The worker forks a task for each placement while its scheduler,
reconciler and heartbeat threads write, and such a task could never adopt its attempt.

So forks and SQLite connections in use exclude each other here: every connection an SQLite engine opens is
counted while it opens (jobs/store/db.py), every one it hands out until it is handed back, and ``quiet()`` holds
new ones back and waits until none is out before the fork. A thread opening a connection (its pragmas take locks too)
was not counted before: a task forked then could wait forever on its first write. PostgreSQL connections are sockets
with no such bookkeeping; their engines are not counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

# Long enough for any one transaction of the worker's threads (milliseconds); past it, a connection held for
# longer (or a thread that takes a second one while holding a first) must not stop tasks from starting.
QUIET_WAIT_S = 2.0


class ForkGuard:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._in_use = 0
        self._forking = False

    def checkout(self, *_args: Any) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._forking, QUIET_WAIT_S)
            self._in_use += 1

    def checkin(self, *_args: Any) -> None:
        with self._cond:
            self._in_use = max(0, self._in_use - 1)
            self._cond.notify_all()

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """A connection being opened: its file opened and its pragmas run take SQLite's locks before any checkout."""
        self.checkout()
        try:
            yield
        finally:
            self.checkin()

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """While the block runs (a fork), no SQLite connection of this process is in use."""
        with self._cond:
            self._forking = True
            try:
                if not self._cond.wait_for(lambda: self._in_use == 0, QUIET_WAIT_S):
                    log.warning("forking while %d SQLite connection(s) of this process are in use", self._in_use)
                yield
            finally:
                self._forking = False
                self._cond.notify_all()


GUARD = ForkGuard()


def count_connections(engine: Engine) -> None:
    """Count ``engine``'s connections in use (an SQLite engine: see the module's docstring)."""
    sa.event.listen(engine, "checkout", GUARD.checkout)
    sa.event.listen(engine, "checkin", GUARD.checkin)
