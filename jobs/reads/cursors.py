"""The opaque positions clients send back: a job list's cursor, a metric list's cursor and an event stream's id.

Each has a regular expression that is exactly the server's rule (the OpenAPI documents it, the API checks it),
so every string the pattern admits is a position the database can compare with, and nothing a client
generated from the OpenAPI sends is refused: numbers are decimal without leading zeros and at most the largest
value of the SQL column they are compared with (64-bit steps and offsets, 32-bit transition ids and seqs), names
travel as hex of their UTF-8 bytes.
"""

from __future__ import annotations

import re

SQL_INT_MAX = 2**63 - 1  # BIGINT: steps, log offsets
SQL_INT4_MAX = 2**31 - 1  # INTEGER: transition ids and event seqs, which PostgreSQL refuses to compare with more


def uint_pattern(limit: int) -> str:
    """A regular expression (no anchors) matching exactly the decimal numbers 0..``limit``, without leading zeros."""
    if limit < 10:
        return f"[0-{limit}]"
    digits = str(limit)
    n = len(digits)
    alternatives = ["0", "[1-9]" if n == 2 else f"[1-9][0-9]{{0,{n - 2}}}"]  # every number shorter than limit
    for i, d in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(d) > low:  # a smaller digit here, then anything
            top = int(d) - 1
            choice = str(low) if top == low else f"[{low}-{top}]"
            rest = n - i - 1
            alternatives.append(digits[:i] + choice + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(digits)
    # Longest first, so a regex engine that stops at the first alternative that matches never cuts a number short.
    return "(?:" + "|".join(sorted(alternatives, key=len, reverse=True)) + ")"


_UINT = uint_pattern(SQL_INT_MAX)
_UINT4 = uint_pattern(SQL_INT4_MAX)
# Names of metrics are at most 128 characters (jobs.store.models.MetricPoint), so at most 512 UTF-8 bytes.
_NAME_HEX = "(?:[0-9a-f]{2}){1,512}"

JOB_CURSOR = r"^[0-9a-f]{1,32}$"
METRIC_CURSOR = f"^{_UINT}\\.{_NAME_HEX}$"
# An optional third part: the last seq of rows the worker found itself (TensorBoard files, checkpoints; jobs/reads/feed.py).
EVENT_ID = f"^{_UINT4}-{_UINT4}(?:-{_UINT4})?$"
JOB_CURSOR_MAX = 32
METRIC_CURSOR_MAX = 19 + 1 + 1024
EVENT_ID_MAX = 10 + 1 + 10 + 1 + 10

_JOB_CURSOR = re.compile(JOB_CURSOR)
_METRIC_CURSOR = re.compile(METRIC_CURSOR)
_EVENT_ID = re.compile(EVENT_ID)


# What a client is told when it sends a position this server did not make (here, and by the API's own validation).
MALFORMED_CURSOR = "malformed cursor; pass back a next_cursor this server returned"
MALFORMED_EVENT_ID = "malformed event id; use the id of a message this stream sent"
MALFORMED_POSITION = "malformed position; pass back the one a followed log ended with"


class MalformedCursor(ValueError):
    """A cursor or event id this server did not make: the field it came in is named by the caller."""


def job_cursor(last_id: str) -> str:
    return last_id


def parse_job_cursor(raw: str) -> str:
    """The id after which a job list continues."""
    if not _JOB_CURSOR.fullmatch(raw):
        raise MalformedCursor(MALFORMED_CURSOR)
    return raw


def metric_cursor(step: int, name: str) -> str:
    return f"{step}.{name.encode().hex()}"


def parse_metric_cursor(raw: str) -> tuple[int, str]:
    """The (step, name) after which a metric list continues."""
    if not _METRIC_CURSOR.fullmatch(raw):
        raise MalformedCursor(MALFORMED_CURSOR)
    step, _, name = raw.partition(".")
    # Bytes no name has are still a position: compared, never an error. No name holds NUL (PostgreSQL refuses it in
    # text), and for names without one, after "x\0..." is after "x": cut there, so PostgreSQL can compare it.
    return int(step), bytes.fromhex(name).decode("utf-8", "replace").split("\0", 1)[0]


def event_id(transition_id: int, seq: int, found: int = 0) -> str:
    return f"{transition_id}-{seq}" + (f"-{found}" if found else "")


def parse_event_id(raw: str) -> tuple[int, int, int]:
    """(transition id, seq, found seq; 0 when the id has no third part)."""
    if not _EVENT_ID.fullmatch(raw):
        raise MalformedCursor(MALFORMED_EVENT_ID)
    parts = [int(p) for p in raw.split("-")]
    return parts[0], parts[1], parts[2] if len(parts) == 3 else 0
