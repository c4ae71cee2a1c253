"""ASGI middleware: request size limit, request ids, access log and request latency.

Pure ASGI rather than BaseHTTPMiddleware, so streamed responses (SSE, followed logs) pass
through untouched and a body is never buffered to be measured.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from http import HTTPStatus
from typing import Any

from fastapi import HTTPException
from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs.infra import logconfig

access_log = logging.getLogger("api.access")


def problem_bytes(status: int, title: str, detail: str) -> bytes:
    return json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail}).encode()


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, setting: str = "TORCHYARD_MAX_REQUEST_BYTES"):
        super().__init__(413, f"request body is larger than {limit} bytes ({setting})")


class BodySizeLimit:
    """413 for bodies over ``limit`` bytes: at once from Content-Length, else as soon as the
    streamed body passes the limit, so an oversized body is never read whole."""

    def __init__(self, app: ASGIApp, limit: int, overrides: dict[str, tuple[int, str]] | None = None):
        self.app, self.default_limit, self.overrides = app, limit, overrides or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # A path with a cap of its own (uploads), named by its setting.
        limit, setting = self.overrides.get(scope["path"], (self.default_limit, "TORCHYARD_MAX_REQUEST_BYTES"))
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _send_problem(send, 413 if declared.isdigit() else 400,
                                BodyTooLarge(limit, setting).detail if declared.isdigit() else "malformed Content-Length")
            return
        if declared is None and _header(scope, b"transfer-encoding") is None:
            # No Content-Length and no Transfer-Encoding: HTTP/1.1 says there is no body (GETs), nothing to limit.
            await self.app(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # An HTTPException: FastAPI turns it into the problem response, wherever the body is read.
                    raise BodyTooLarge(limit, setting)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await _send_problem(send, 413, str(exc.detail))


async def _send_problem(send: Send, status: int, detail: str) -> None:
    body = problem_bytes(status, HTTPStatus(status).phrase, detail)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body})


class RequestContext:
    """Request id (``X-Request-ID``, echoed or made), one structured access-log line per request,
    and the request latency histogram labelled by route template (not raw path: bounded cardinality)."""

    def __init__(self, app: ASGIApp, latency: Histogram):
        self.app, self.latency = app, latency
        # The histogram's child per (method, route, status): ``labels()`` takes a lock and builds a key per call.
        self._observers: dict[tuple[str, str, str], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = (_header(scope, b"x-request-id") or b"").decode("latin-1")
        rid = incoming if 0 < len(incoming) <= 128 and incoming.isprintable() else _new_request_id()
        token = logconfig.request_id.set(rid)
        status = 500
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - start
            route = _route_template(scope)
            key = (scope["method"], route, str(status))
            observer = self._observers.get(key)
            if observer is None:
                observer = self._observers[key] = self.latency.labels(*key)
            observer.observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):  # the line's fields are not gathered for nothing
                extra: dict[str, Any] = {
                    "method": scope["method"], "path": scope["path"], "route": route, "status": status,
                    "duration_ms": round(elapsed * 1000, 1), "job_id": (scope.get("path_params") or {}).get("job_id"),
                    "owner": (scope.get("state") or {}).get("owner"),  # request.state.owner, set by auth
                }
                access_log.info("%s %s %d %.1fms", scope["method"], scope["path"], status, elapsed * 1000, extra=extra)
            logconfig.request_id.reset(token)


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case, as ASGI gives names), without building a dict per request."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


# Request ids: 16 hex digits counting up from a random start per process, unique across processes in practice, and
# without a system call per request as secrets.token_hex made (ids only correlate log lines; they are no secret).
_request_ids = itertools.count(int.from_bytes(os.urandom(8), "big"))


def _new_request_id() -> str:
    return f"{next(_request_ids) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"
