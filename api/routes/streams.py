"""Live streams of one job: ``/events`` (Server-Sent Events) and ``/logs`` (text, optionally followed).

Both poll SQL (and the log file) every ``sse_poll_interval_s`` in short sessions of their own,
so an open stream holds no database connection between polls.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path as FilePath
from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine
from sqlmodel import Session
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from api.auth import PrincipalDep
from api.schemas import sse_event_schema
from jobs import artifacts, feed, service
from jobs.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["streams"])

JobId = Annotated[str, Path(min_length=1, max_length=64, description="Job id.")]
_READ_MAX = 1 << 20

_SSE_DOC = {200: {"description": (
    "text/event-stream. Events: `status` {status, reason, at, attempt} (the first message is the current status), "
    "`metric` {step, epoch, values, time}, `checkpoint` {step, epoch, path, created_at, details}, and `end` {status} "
    "once the job is terminal, after which the stream closes. Every message's `id` resumes the stream after it."),
    "content": {"text/event-stream": {"schema": sse_event_schema()}}}}
_TEXT_DOC = {200: {"description": "The log as text; with follow=true, appended lines as they come until the attempt ends.",
                   "content": {"text/plain": {"schema": {"type": "string"}}}}}


def _in_session(engine: Engine, fn, *args):  # noqa: ANN001, ANN202
    with Session(engine, expire_on_commit=False) as session:
        return fn(session, *args)


@router.get("/{job_id}/events", response_class=EventSourceResponse, responses=_SSE_DOC,
            summary="Live status changes, metrics and checkpoints (Server-Sent Events), resumable with Last-Event-ID")
async def job_events(
    job_id: JobId,
    principal: PrincipalDep,
    request: Request,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
    last_event_id: Annotated[str | None, Query(
        max_length=64, description="Same as the Last-Event-ID header, for clients that cannot set headers.")] = None,
) -> EventSourceResponse:
    engine: Engine = request.app.state.engine
    settings: Settings = request.app.state.settings
    job = await run_in_threadpool(_in_session, engine, service.get_job, principal.owner, job_id)
    raw = last_event_id_header or last_event_id
    try:
        cursor = feed.Cursor.parse(raw) if raw else None
    except ValueError as exc:
        raise HTTPException(422, f"Last-Event-ID: {exc}") from exc

    async def stream() -> AsyncIterator[ServerSentEvent]:
        nonlocal cursor
        if cursor is None:
            first = await run_in_threadpool(_in_session, engine, feed.snapshot, job)
            yield _sse(first)
            cursor = feed.Cursor.parse(first.id)
        while True:
            batch = await run_in_threadpool(_in_session, engine, feed.poll, job_id, cursor)
            for message in batch.messages:
                yield _sse(message)
            cursor = batch.cursor
            if batch.ended:
                return
            if not batch.more:
                await asyncio.sleep(settings.sse_poll_interval_s)

    return EventSourceResponse(stream(), ping=15, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _sse(message: feed.Message) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(message.data, separators=(",", ":")), event=message.event, id=message.id)


@router.get("/{job_id}/logs", response_class=StreamingResponse, responses=_TEXT_DOC,
            summary="The launcher log or one rank's log of an attempt; tail and follow")
async def job_logs(
    job_id: JobId,
    principal: PrincipalDep,
    request: Request,
    rank: Annotated[int | None, Query(ge=0, le=65535, description="Global rank; omitted: torchrun's launcher log.")] = None,
    stream: Annotated[Literal["stderr", "stdout"], Query(description="Which file of the rank (the trainer logs to stderr).")] = "stderr",
    tail: Annotated[int | None, Query(ge=1, le=100_000, description="Only the last N lines.")] = None,
    follow: Annotated[bool, Query(description="Keep sending appended lines until the attempt ends.")] = False,
    attempt: Annotated[int | None, Query(ge=1, le=10_000, description="Whole-job attempt; default the current one.")] = None,
) -> StreamingResponse:
    engine: Engine = request.app.state.engine
    settings: Settings = request.app.state.settings
    job, attempt = await run_in_threadpool(_in_session, engine, service.job_log, settings, principal.owner, job_id, attempt)
    what = "launcher log" if rank is None else f"rank {rank} {stream}"

    def locate() -> FilePath | None:
        return artifacts.log_file(settings, job.id, attempt, rank, stream)

    path = await run_in_threadpool(locate)
    if path is None and not follow:
        raise service.FileUnavailable(f"job {job_id} has no {what} for attempt {attempt} (yet)")
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Log-Attempt": str(attempt)}
    if path is not None and not follow:
        size = path.stat().st_size
        start = await run_in_threadpool(artifacts.tail_offset, path, tail) if tail else 0
        return StreamingResponse(artifacts.iter_range(path, start, size), media_type="text/plain; charset=utf-8", headers=headers)

    async def followed() -> AsyncIterator[bytes]:
        current, offset = path, None
        while True:
            # Done is read before the file: the supervisor finishes writing before the status changes.
            done = await run_in_threadpool(_in_session, engine, service.log_follow_done, job.id, attempt)
            latest = await run_in_threadpool(locate)
            if latest is not None and latest != current:
                current, offset = latest, None  # torchrun restarted the ranks: follow the new restart's file
            if current is not None:
                if offset is None:
                    offset = await run_in_threadpool(artifacts.tail_offset, current, tail) if tail else 0
                while True:  # bounded reads, so a large backlog is streamed rather than held in memory
                    chunk = await run_in_threadpool(artifacts.read_range, current, offset, offset + _READ_MAX)
                    if chunk:
                        offset += len(chunk)
                        yield chunk
                    if len(chunk) < _READ_MAX:
                        break
            if done:
                return
            await asyncio.sleep(settings.sse_poll_interval_s)

    return StreamingResponse(followed(), media_type="text/plain; charset=utf-8", headers=headers)
