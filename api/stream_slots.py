"""Per-owner cap on the live streams (``/events``, followed ``/logs``) one API process holds open.

A stream holds a coroutine, a socket and a poll of SQL and files every ``sse_poll_interval_s``;
without a cap one key could open enough of them to starve everyone else. The cap is per process:
what it protects (the event loop, the thread pool, connections) is per process too.
"""

from __future__ import annotations

import threading
import weakref

from jobs.store.limits import OverLimit


class Slot:
    """One open stream of one owner; ``release`` is idempotent."""

    def __init__(self, slots: StreamSlots, owner: str):
        self._slots, self._owner, self._held = slots, owner, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._release(self._owner)

    def bind(self, body: object) -> object:
        """Release when ``body`` (the response's generator) is gone, even if it never started: a client that
        disconnects before the first byte never runs the generator's ``finally``."""
        weakref.finalize(body, self.release)
        return body


class StreamSlots:
    def __init__(self, per_owner: int):
        self.per_owner = per_owner
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, owner: str) -> Slot:
        """A slot for a new stream of ``owner``; OverLimit (HTTP 429) when it already holds ``per_owner``."""
        with self._lock:
            held = self._open.get(owner, 0)
            if held >= self.per_owner:
                raise OverLimit(f"owner {owner!r} already has {held} open streams, the cap is {self.per_owner} "
                                "(TORCHYARD_MAX_STREAMS_PER_OWNER); close one and try again", retry_after_s=5)
            self._open[owner] = held + 1
        return Slot(self, owner)

    def held(self, owner: str | None = None) -> int:
        """Streams open now: of ``owner``, or of every owner."""
        with self._lock:
            return self._open.get(owner, 0) if owner is not None else sum(self._open.values())

    def _release(self, owner: str) -> None:
        with self._lock:
            left = self._open.get(owner, 0) - 1
            if left > 0:
                self._open[owner] = left
            else:
                self._open.pop(owner, None)
