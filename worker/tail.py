"""Follows a run's events.jsonl, handing over complete, well-formed lines only."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.sandbox.run_dirs import open_job_file

log = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class BadEvent:
    """A line that is JSON but not an event the service can store; the job fails naming it."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"events.jsonl line {self.line}: {self.reason}"


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def check_event(event: Any) -> str | None:
    """Why ``event`` cannot be stored (None when it can). SQL columns are 64-bit; values must be a mapping of numbers."""
    if not isinstance(event, dict):
        return f"not a JSON object ({type(event).__name__})"
    if not _is_int64(event.get("seq")):
        return "seq is not an integer in 0..2^63-1"
    for key in ("step", "epoch"):
        if event.get(key) is not None and not _is_int64(event[key]):
            return f"{key} is not an integer in 0..2^63-1"
    kind = event.get("type")
    if kind == "metric":
        values = event.get("values")
        if values is not None and not isinstance(values, dict):
            return f"values is not an object ({type(values).__name__})"
        for name, value in (values or {}).items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                return f"values[{name!r}] is not a number"
            if isinstance(value, int) and abs(value) > INT64_MAX:
                return f"values[{name!r}] is beyond 64 bits"
    elif kind == "checkpoint" and not isinstance(event.get("path"), str):
        return "checkpoint path is not a string"
    elif kind == "status" and event.get("phase") is not None and not isinstance(event["phase"], str):
        return "phase is not a string"
    if not isinstance(event.get("time", 0.0), (int, float)):
        return "time is not a number"
    return None


class EventTail:
    """Reads what rank 0 appended since the last acknowledged read. A line still being written (no
    newline yet) is left for the next call, so a half-flushed event is never parsed.

    ``read`` does not move the offset; ``ack`` does, once the caller stored what it read. A read whose
    rows never committed (the database blipped) is read again: ingestion is idempotent by seq.
    """

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.line = 0  # lines before ``offset``
        self._pending: tuple[int, int] | None = None
        self.bad: BadEvent | None = None

    def read(self) -> list[dict[str, Any]]:
        try:
            # The job owns this file: a FIFO or a link planted in its place must neither hang nor redirect us.
            with os.fdopen(open_job_file(self.path), "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        events: list[dict[str, Any]] = []
        consumed, line_no = 0, self.line
        for raw in chunk[: end + 1].split(b"\n")[:-1]:
            line_no += 1
            if raw.strip():
                try:
                    event = json.loads(raw)
                except ValueError:
                    # A torn line a crash left behind (the writer ends it on restart): nothing to store.
                    log.warning("skipping an unparsable line %d in %s", line_no, self.path)
                    event = None
                if event is not None:
                    reason = check_event(event)
                    if reason is not None:
                        # Stop before it: the events up to here are stored, then the job fails naming the line.
                        self.bad = BadEvent(line_no, reason)
                        line_no -= 1
                        break
                    events.append(event)
            consumed += len(raw) + 1
        self._pending = (self.offset + consumed, line_no)
        return events

    def ack(self) -> None:
        """The events of the last ``read`` are stored: the next read starts after them."""
        if self._pending is not None:
            self.offset, self.line = self._pending
            self._pending = None
