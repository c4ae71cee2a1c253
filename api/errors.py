"""Every error as application/problem+json (RFC 9457) with a clear ``detail``."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jobs.service import JobConflict, JobNotFound
from trainer.spec import SpecError

PROBLEM = "application/problem+json"


def problem(status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_problem(errors: list[dict[str, Any]]) -> JSONResponse:
    items = [{"field": _field(e["loc"]), "message": e["msg"]} for e in errors]
    detail = "; ".join(f"{i['field']}: {i['message']}" for i in items)
    return problem(422, detail, errors=items)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_problem(list(exc.errors()))

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        return validation_problem([{"loc": p.loc, "msg": p.msg} for p in exc.problems])

    @app.exception_handler(JobNotFound)
    async def _not_found(_: Request, exc: JobNotFound) -> JSONResponse:
        return problem(404, str(exc))

    @app.exception_handler(JobConflict)
    async def _conflict(_: Request, exc: JobConflict) -> JSONResponse:
        return problem(409, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
