"""The Sink protocol and the background thread that feeds sinks off the training step."""

from __future__ import annotations

import atexit
import logging
import queue
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

# One metric event: (step, {name: value}); a value is None where the writer stored a non-finite number.
Point = tuple[int, Mapping[str, float | None]]


class Sink(Protocol):
    """A destination for rank 0's metrics. Called on the runner's thread only, never on the training step."""

    name: str

    def open(self) -> None:
        """Connect, create files; called once on the runner's thread before the first write."""

    def write(self, points: Sequence[Point]) -> None:
        """Record a batch of metric events, oldest first."""

    def close(self, failed: bool = False) -> None:
        """Flush and release everything; called once, last. ``failed``: the process is ending on an exception."""


_STOP = object()


class SinkRunner:
    """Feeds sinks from a bounded queue on a daemon thread. ``put`` never blocks: when the queue is full
    (a sink far behind), the point is dropped and counted rather than the step waiting."""

    def __init__(self, sinks: Sequence[Sink], max_queued: int = 100_000, batch: int = 1000, close_timeout_s: float = 60.0):
        self.sinks = list(sinks)
        self.dropped = 0
        self._batch = batch
        self._close_timeout_s = close_timeout_s
        self._queue: queue.Queue[Any] = queue.Queue(max_queued)
        self._thread = threading.Thread(target=self._run, name="torchyard-sinks", daemon=True)
        self._closed = False
        self._failed = False
        self._weights: str | None = None
        self._thread.start()
        # A rank that dies on an exception still flushes what it reported (and ends its MLflow run as failed);
        # a normal end closes first, through EventWriter.close.
        atexit.register(self.close)

    def put(self, step: int, values: Mapping[str, float | None]) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait((int(step), dict(values)))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("metric sinks are behind: %d points dropped so far", self.dropped)

    def note_weights(self, relative: str) -> None:
        """A consolidated weights file was saved; the newest one is handed to the sinks at close (never queued,
        so never dropped and never waited for)."""
        self._weights = relative

    def close(self, failed: bool | None = None) -> None:
        """Write what is queued, flush and close every sink; waits at most ``close_timeout_s``. ``failed`` defaults to
        whether the interpreter is ending on an unhandled exception (``sys.last_value``, set before atexit runs)."""
        if self._closed:
            return
        self._closed = True
        self._failed = getattr(sys, "last_value", None) is not None if failed is None else failed
        try:
            self._queue.put(_STOP, timeout=self._close_timeout_s)  # the one item that must arrive, unless a sink is stuck
        except queue.Full:
            log.warning("metric sinks are stuck; closing without them")
            return
        self._thread.join(self._close_timeout_s)
        if self._thread.is_alive():
            log.warning("metric sinks did not finish within %.0f s; the rest is lost", self._close_timeout_s)

    def _run(self) -> None:
        live = []
        for sink in self.sinks:
            try:
                sink.open()
                live.append(sink)
            except Exception:  # noqa: BLE001 - a sink that cannot start must not end training
                log.exception("metric sink %s could not start; it is skipped", sink.name)
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < self._batch:  # what else is already waiting goes in the same batch
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = any(item is _STOP for item in batch)
            points = [item for item in batch if item is not _STOP]
            for sink in list(live):
                try:
                    if points:
                        sink.write(points)
                    if stopping and self._weights and hasattr(sink, "note_weights"):
                        sink.note_weights(self._weights)
                except Exception:  # noqa: BLE001
                    log.exception("metric sink %s failed; it is skipped from now on", sink.name)
                    live.remove(sink)
        for sink in self.sinks:
            if sink in live:
                try:
                    sink.close(failed=self._failed)
                except Exception:  # noqa: BLE001
                    log.exception("metric sink %s failed to close", sink.name)
