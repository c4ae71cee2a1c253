"""A small server-sent-events parser (the WHATWG event-stream format) over lines of text."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RawEvent:
    event: str
    data: str
    id: str | None
    retry_ms: int | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[RawEvent]:
    """Yield one RawEvent per blank-line-terminated block. Comments (``: keepalive``) are skipped,
    multi-line ``data:`` is joined with newlines, and the last ``id:`` is carried forward as the
    spec says, so callers can resume with ``Last-Event-ID``."""
    event, data, last_id, retry = "", [], None, None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield RawEvent(event or "message", "\n".join(data), last_id, retry)
            event, data, retry = "", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            if "\0" not in value:
                last_id = value
        elif name == "retry" and value.isdigit():
            retry = int(value)
    # A stream cut mid-event loses that event: it will be replayed after Last-Event-ID.
