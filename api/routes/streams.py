"""Live streams of one job: ``/events`` (Server-Sent Events) and ``/logs`` (text, optionally followed).

Both poll SQL (and the log file) every ``sse_poll_interval_s`` in short sessions of their own,
so an open stream holds no database connection between polls. At every poll the request's key
is checked again (a revoked key's stream ends), each owner holds at most
``max_streams_per_owner`` open streams per API process (429 beyond), and an event stream ends
after ``stream_max_lifetime_s`` with a ``reconnect`` message that clients resume from with
Last-Event-ID. A followed log ends with its attempt, or at the same maximum lifetime with a reconnect marker and
the position to resume from (jobs.reads.job_logs.RECONNECT_MARKER), which clients send back as ``position``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Annotated, BinaryIO, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine
from sqlmodel import Session
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from api.auth import PrincipalDep, still_authorized
from api.deps import JobId
from api.errors import invalid, responses
from api.schemas import sse_event_schema
from api.stream_slots import StreamSlots
from jobs.reads import artifacts, cursors, feed, job_lookup
from jobs.reads import job_logs as job_logs_files
from jobs.settings import Settings
from jobs.storage.store import StoreError
from jobs.storage.stored_file import size_of

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["streams"])

_READ_MAX = 1 << 20

_SSE_DOC = {200: {"description": (
    "text/event-stream. Events: `status` {status, reason, at, attempt} (the first message is the current status), "
    "`metric` {step, epoch, values, time}, `checkpoint` {step, epoch, path, created_at, details}, and `end` {status} "
    "once the job is terminal, after which the stream closes. `reconnect` {reason} ends a stream that reached its "
    "maximum lifetime (TORCHYARD_STREAM_MAX_LIFETIME_S): reconnect with its id as Last-Event-ID. Every message's `id` "
    "resumes the stream after it."),
    "content": {"text/event-stream": {"schema": sse_event_schema()}}}}
_TEXT_DOC = {200: {"description": "The log as text; with follow=true, appended lines as they come until the attempt ends.",
                   "content": {"text/plain": {"schema": {"type": "string"}}}}}


def _in_session(engine: Engine, fn, *args):  # noqa: ANN001, ANN202
    with Session(engine, expire_on_commit=False) as session:
        return fn(session, *args)


def _slots(request: Request) -> StreamSlots:
    return request.app.state.stream_slots


@router.get("/{job_id}/events", response_class=EventSourceResponse, responses={**_SSE_DOC, **responses(429)},
            summary="Live status changes, metrics and checkpoints (Server-Sent Events), resumable with Last-Event-ID")
async def job_events(
    job_id: JobId,
    principal: PrincipalDep,
    request: Request,
    last_event_id_header: Annotated[str | None, Header(
        alias="Last-Event-ID", pattern=cursors.EVENT_ID,
        description="The id of the last message received: the stream resumes after it.")] = None,
    last_event_id: Annotated[str | None, Query(
        pattern=cursors.EVENT_ID,
        description="Same as the Last-Event-ID header, for clients that cannot set headers.")] = None,
) -> EventSourceResponse:
    engine: Engine = request.app.state.engine
    settings: Settings = request.app.state.settings
    job = await run_in_threadpool(_in_session, engine, job_lookup.get_job, principal.scope, job_id)
    raw = last_event_id_header or last_event_id
    try:
        cursor = feed.Cursor.parse(raw) if raw else None
    except cursors.MalformedCursor as exc:
        where = ("header", "Last-Event-ID") if last_event_id_header else ("query", "last_event_id")
        raise invalid(*where, str(exc)) from exc
    slot = _slots(request).acquire(principal.owner)

    async def stream() -> AsyncIterator[ServerSentEvent]:
        nonlocal cursor
        ends_at = time.monotonic() + settings.stream_max_lifetime_s
        try:
            if cursor is None:
                first = await run_in_threadpool(_in_session, engine, feed.snapshot, job)
                yield _sse(first)
                cursor = feed.Cursor.parse(first.id)
            while True:
                # Every poll: a key revoked since the stream opened ends it.
                if not await run_in_threadpool(still_authorized, request, principal):
                    log.info("job %s: event stream ended, its API key is no longer valid", job_id, extra={"job_id": job_id})
                    return
                batch = await run_in_threadpool(_in_session, engine, feed.poll, job_id, cursor)
                for message in batch.messages:
                    yield _sse(message)
                cursor = batch.cursor
                if batch.ended:
                    return
                if time.monotonic() >= ends_at:
                    yield _sse(feed.Message("reconnect", {"reason": "stream lifetime reached; reconnect with Last-Event-ID"},
                                            cursor.encode()))
                    return
                if not batch.more:
                    await asyncio.sleep(settings.sse_poll_interval_s)
        finally:
            slot.release()

    body = stream()
    slot.bind(body)
    return EventSourceResponse(body, ping=15, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _sse(message: feed.Message) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(message.data, separators=(",", ":")), event=message.event, id=message.id)


def _close_all(files: Iterable[BinaryIO]) -> None:
    for f in files:
        f.close()


def _iter_files(ranges: list[tuple[BinaryIO, int, int]]) -> Iterator[bytes]:
    """The byte ranges [start, end) of the open files one after another; closes them all, read or not."""
    try:
        for f, start, end in ranges:
            yield from artifacts.iter_file(f, start, end)
    finally:
        _close_all(f for f, _, _ in ranges)


async def _appended(current: list[str], handles: dict[str, BinaryIO], offsets: dict[str, int],
                    start_of: Callable[[BinaryIO, str, int], Awaitable[int]], whole_lines: bool) -> AsyncIterator[bytes]:
    """What each open log of ``current`` holds past its offset, in order; ``offsets`` follows what was yielded.
    ``whole_lines``: only up to each file's last newline (several nodes' files are never mixed mid-line)."""
    for relative in current:
        f = handles.get(relative)
        if f is None:
            continue
        if relative not in offsets:
            offsets[relative] = await start_of(f, relative, size_of(f))
        while True:  # bounded reads, so a large backlog is streamed rather than held in memory
            chunk = await run_in_threadpool(artifacts.read_at, f, offsets[relative], _READ_MAX)
            if whole_lines and len(chunk) < _READ_MAX:
                chunk = chunk[:chunk.rfind(b"\n") + 1]
            if chunk:
                offsets[relative] += len(chunk)
                yield chunk
            if len(chunk) < _READ_MAX:
                break


@router.get("/{job_id}/logs", response_class=StreamingResponse, responses={**_TEXT_DOC, **responses(429)},
            summary="An attempt's log: every rank merged (default), one rank as printed, one stream, or the launcher's")
async def job_logs(
    job_id: JobId,
    principal: PrincipalDep,
    request: Request,
    rank: Annotated[str | None, Query(pattern=r"^(launcher|[0-9]{1,5})$", description=(
        "A global rank: its stdout and stderr as printed. `launcher`: torchrun's own log. "
        "Omitted: every rank's output merged, each line prefixed `[rank N]`."))] = None,
    stream: Annotated[Literal["stderr", "stdout"] | None, Query(
        description="With a rank: only what its Python wrote to that stream.")] = None,
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="Only the last N lines (of each node's log, merged).")] = None,
    follow: Annotated[bool, Query(description=(
        "Keep sending appended lines until the attempt ends. A stream that reaches its maximum lifetime "
        "(TORCHYARD_STREAM_MAX_LIFETIME_S) ends with the byte 0x1e, `torchyard-reconnect `, a position and a newline: "
        "reconnect with that position (and the attempt of X-Log-Attempt) to go on where it stopped."))] = False,
    position: Annotated[str | None, Query(
        pattern=job_logs_files.POSITION_PATTERN,
        description="Where to start: the position a followed log ended with (tail is then ignored).")] = None,
    attempt: Annotated[int | None, Query(ge=1, le=10_000, description="Whole-job attempt; default the current one.")] = None,
) -> StreamingResponse:
    engine: Engine = request.app.state.engine
    settings: Settings = request.app.state.settings
    if stream is not None and (rank is None or rank == job_logs_files.LAUNCHER):
        raise invalid("query", "stream", "needs a rank number; the merged and launcher logs are one stream")
    job, attempt = await run_in_threadpool(_in_session, engine, job_logs_files.job_log, settings, principal.scope, job_id, attempt)
    what = job_logs_files.describe(rank, stream)
    resume = job_logs_files.decode_position(position) if position is not None else None  # the pattern has checked it

    async def start_of(f: BinaryIO, relative: str, end: int) -> int:
        if resume is not None:
            return resume.get(job_logs_files.file_key(relative), 0)
        return await run_in_threadpool(artifacts.tail_offset, f, tail, end) if tail else 0

    def locate() -> list[str]:
        return job_logs_files.files(settings, job.id, attempt, rank, stream)

    # Each file opened once, without following a symlink anywhere; from here on only the descriptors are read.
    opened = await run_in_threadpool(job_logs_files.open_logs, settings, job.id, await run_in_threadpool(locate))
    if not opened and not follow:
        raise artifacts.FileUnavailable(f"job {job_id} has no {what} for attempt {attempt} (yet)")
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Log-Attempt": str(attempt)}
    if not follow:
        ranges = []
        for relative, f in opened:
            size = size_of(f)
            ranges.append((f, await start_of(f, relative, size), size))
        # A plain iterator: Starlette reads it in a thread, so file reads never block the event loop.
        return StreamingResponse(_iter_files(ranges), media_type="text/plain; charset=utf-8", headers=headers)
    try:
        slot = _slots(request).acquire(principal.owner)
    except BaseException:
        _close_all(f for _, f in opened)
        raise

    async def followed() -> AsyncIterator[bytes]:
        ends_at = time.monotonic() + settings.stream_max_lifetime_s
        handles: dict[str, BinaryIO] = dict(opened)
        offsets: dict[str, int] = {}
        current = [relative for relative, _ in opened]
        stored = settings.storage_url is not None
        read_at = -math.inf
        store_down = False
        try:
            while True:
                if not await run_in_threadpool(still_authorized, request, principal):
                    log.info("job %s: log stream ended, its API key is no longer valid", job_id, extra={"job_id": job_id})
                    return
                # Done is read before the files: the supervisor finishes writing (and uploading) before the status changes.
                done = await run_in_threadpool(_in_session, engine, job_logs_files.log_follow_done, job.id, attempt)
                # A stored log changes only when its worker uploads it: the store is read twice per upload period.
                if done or not stored or time.monotonic() - read_at >= settings.storage_sync_interval_s / 2:
                    read_at = time.monotonic()
                    try:
                        current = await run_in_threadpool(locate)  # a torchrun restart moves a rank to a new file
                        if stored:  # an upload replaces the object whole: opened again, it shows what was added
                            _close_all(handles.values())
                            handles.clear()
                        for relative in set(handles) - set(current):
                            handles.pop(relative).close()
                        missing = [r for r in current if r not in handles]
                        handles.update(await run_in_threadpool(job_logs_files.open_logs, settings, job.id, missing))
                        async for chunk in _appended(current, handles, offsets, start_of, whole_lines=len(current) > 1 and not done):
                            yield chunk
                        if store_down:
                            log.info("job %s: log stream reads the object store again", job_id, extra={"job_id": job_id})
                        store_down = False
                    except StoreError as exc:  # the store down for a while: the stream waits for it, up to its lifetime
                        if not store_down:
                            log.warning("job %s: log stream waits for the object store: %s", job_id, exc, extra={"job_id": job_id})
                        store_down, done = True, False
                if done:
                    return
                if time.monotonic() >= ends_at:
                    where = job_logs_files.encode_position({r: offsets[r] for r in current if r in offsets})
                    yield f"{job_logs_files.RECONNECT_MARKER}{where}\n".encode()
                    return
                await asyncio.sleep(settings.sse_poll_interval_s)
        finally:
            _close_all(handles.values())
            slot.release()

    body = followed()
    slot.bind(body)
    return StreamingResponse(body, media_type="text/plain; charset=utf-8", headers=headers)
