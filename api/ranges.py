"""Downloads of files already open (weights, artifacts): whole (200), one byte range (206) or none (416).

One range per request is served. A ``Range`` header this server does not serve as a range (several ranges,
another unit, a malformed or backwards range) is ignored and the whole file answered with 200, as RFC 9110
allows; a well-formed single range that no byte of the file satisfies answers 416 with ``Content-Range:
bytes */<size>``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, BinaryIO

from fastapi import Header, HTTPException
from fastapi.responses import StreamingResponse

from jobs.reads import artifacts

_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")

RangeHeader = Annotated[str | None, Header(
    alias="Range", max_length=200,
    description="One byte range, e.g. bytes=0-1023, bytes=1024- or bytes=-512. Several ranges, or anything else, "
                "answer the whole file with 200; a range outside the file answers 416.")]


class Unsatisfiable(ValueError):
    def __init__(self, size: int):
        self.size = size
        super().__init__(f"Range: outside the file's {size} bytes")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The [start, end) a ``Range`` header asks of a file of ``size`` bytes; None for the whole file (no header,
    or one answered in full). Raises Unsatisfiable for a single range no byte of the file lies in."""
    match = _RANGE.match((header or "").strip())
    if not match or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes; a suffix of 0 bytes is satisfied by none
        length = int(last)
        if length == 0 or size == 0:
            raise Unsatisfiable(size)
        return max(0, size - length), size
    start = int(first)
    if last != "" and int(last) < start:
        return None  # not a valid range (RFC 9110 14.1.1): the header is ignored
    if start >= size:
        raise Unsatisfiable(size)
    return start, size if last == "" else min(size, int(last) + 1)


def file_response(f: BinaryIO, size: int, name: str, media_type: str, range_header: str | None) -> StreamingResponse:
    """The open file ``f`` (its size fixed at ``size``, so a growing file sends what was promised), whole or the range
    asked; closes ``f`` when the body is sent, or at once when the range is refused."""
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Accept-Ranges": "bytes"}
    try:
        wanted = byte_range(range_header, size)
    except Unsatisfiable as exc:
        f.close()
        raise HTTPException(416, str(exc), headers={"Content-Range": f"bytes */{size}"}) from None
    start, end = wanted or (0, size)
    headers["Content-Length"] = str(end - start)
    if wanted is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    # A plain iterator: Starlette reads it in a thread, so file reads never block the event loop.
    return StreamingResponse(artifacts.iter_file(f, start, end), status_code=206 if wanted else 200,
                             media_type=media_type, headers=headers)


def file_responses(description: str, media_type: str = "application/octet-stream") -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of a download: the bytes whole (200) or one range of them (206)."""
    binary = {media_type: {"schema": {"type": "string", "format": "binary"}}}
    ranged = {"Content-Range": {"description": "bytes <first>-<last>/<size>", "schema": {"type": "string"}}}
    return {200: {"content": binary, "description": description},
            206: {"content": binary, "description": f"{description} One byte range of it (Range).", "headers": ranged}}
