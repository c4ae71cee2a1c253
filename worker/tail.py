"""Follows a run's events.jsonl, handing over complete lines only."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EventTail:
    """Reads what rank 0 appended since the last call. A line still being written (no
    newline yet) is left for the next call, so a half-flushed event is never parsed."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        events = []
        for line in chunk[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                log.warning("skipping a malformed line in %s", self.path)
                continue
            if isinstance(event, dict):
                events.append(event)
        return events
