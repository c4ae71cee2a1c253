"""Every error as application/problem+json (RFC 9457) with a clear ``detail``, and the OpenAPI
schema saying so for every operation."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import methods
from api.schemas import SSE_PAYLOADS, Problem
from jobs.infra.keys import KeyNotFound
from jobs.lifecycle.job_control import JobConflict
from jobs.lifecycle.submission import IdempotencyMismatch
from jobs.reads import cursors
from jobs.reads.artifacts import FileUnavailable
from jobs.reads.job_lookup import JobNotFound
from jobs.storage.store import StoreError
from jobs.store.limits import OverLimit
from jobspec.messages import user_problems
from jobspec.spec import JobSpec, ScriptJobSpec, SpecError

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"


def problem(status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


# Positions only this server makes: a client passes back what it was given, so a mismatch is worded as that, not as
# the regular expression (the OpenAPI states it; spelled out here it is hundreds of characters of digit ranges).
_SERVER_MADE = {
    ("query", "cursor"): cursors.MALFORMED_CURSOR,
    ("header", "Last-Event-ID"): cursors.MALFORMED_EVENT_ID,
    ("query", "last_event_id"): cursors.MALFORMED_EVENT_ID,
    ("query", "position"): cursors.MALFORMED_POSITION,
}


def _parameter_message(error: dict[str, Any]) -> str:
    if error.get("type") == "string_pattern_mismatch":
        return _SERVER_MADE.get(tuple(error["loc"][:2]), error["msg"])
    return error["msg"]


def validation_problem(errors: list[dict[str, Any]], roots: tuple[Any, ...] = ()) -> JSONResponse:
    """422 naming each field once, in the user's words; ``roots``: the models the body was read as, for
    what a field accepts and the field names an unknown key is compared with."""
    body = [e for e in errors if e["loc"][:1] == ("body",)]
    rest = [{"loc": e["loc"], "msg": _parameter_message(e)} for e in errors if e["loc"][:1] != ("body",)]
    worded = [{"loc": ("body", *loc), "msg": msg} for loc, msg in user_problems([{**e, "loc": e["loc"][1:]} for e in body], roots)]
    items = [{"field": _field(e["loc"]), "message": e["msg"]} for e in rest + worded]
    detail = "; ".join(f"{i['field']}: {i['message']}" for i in items) or "invalid request"
    return problem(422, detail, errors=items)


def invalid(where: str, field: str, message: str) -> RequestValidationError:
    """A 422 naming one field (``where``: query, header, path or body), raised by a route that checks more than a schema can say."""
    return RequestValidationError([{"loc": (where, field), "msg": message, "type": "value_error"}])


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        submitting = request.method == "POST" and request.url.path.rstrip("/").endswith("/v1/jobs")
        return validation_problem(list(exc.errors()), (JobSpec, ScriptJobSpec) if submitting else ())

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        return validation_problem([{"loc": p.loc, "msg": p.msg} for p in exc.problems])

    @app.exception_handler(IdempotencyMismatch)
    async def _idempotency(_: Request, exc: IdempotencyMismatch) -> JSONResponse:
        return validation_problem([{"loc": ("header", "Idempotency-Key"), "msg": str(exc)}])

    @app.exception_handler(JobNotFound)
    @app.exception_handler(KeyNotFound)
    @app.exception_handler(FileUnavailable)
    async def _not_found(_: Request, exc: Exception) -> JSONResponse:
        return problem(404, str(exc))

    @app.exception_handler(JobConflict)
    async def _conflict(_: Request, exc: JobConflict) -> JSONResponse:
        return problem(409, str(exc))

    @app.exception_handler(OverLimit)
    async def _over_limit(_: Request, exc: OverLimit) -> JSONResponse:
        return problem(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(OperationalError)
    async def _sql_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.error("SQL error: %s", exc.__class__.__name__, exc_info=exc)
        return problem(503, "the database does not answer; try again shortly", headers={"Retry-After": "5"})

    @app.exception_handler(RedisError)
    async def _redis_down(_: Request, exc: RedisError) -> JSONResponse:
        log.error("Redis error: %s", exc.__class__.__name__, exc_info=exc)
        return problem(503, "Redis does not answer; try again shortly", headers={"Retry-After": "5"})

    @app.exception_handler(StoreError)
    async def _store_down(_: Request, exc: StoreError) -> JSONResponse:
        log.error("%s", exc)  # the key and the server's error code, never a credential (jobs/storage/store.py)
        return problem(503, "the object store does not answer; try again shortly", headers={"Retry-After": "5"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette's names the methods of one route only; the path may have several
            allowed = methods.allow_header(request.app, request.url.path)
            if not allowed:  # only the OPTIONS route (every path) matched: there is no such path
                return problem(404, methods.NO_SUCH_PATH)
            headers["Allow"] = allowed
            return problem(405, f"{request.method} is not allowed here; this path answers {allowed}", headers=headers)
        return problem(exc.status_code, str(exc.detail), headers=headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=exc)
        return problem(500, "internal error; the server log has the details")

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]


_STATUSES = {
    400: "Malformed request (a Content-Length that is not a number, a request HTTP cannot parse).",
    401: "Missing, invalid or revoked API key.",
    403: "Needs the admin key.",
    404: "No such resource for this owner (another owner's job answers 404 too).",
    409: "The job's status does not allow this.",
    413: "Request body over TORCHYARD_MAX_REQUEST_BYTES (TORCHYARD_MAX_CODE_BYTES for code bundles).",
    415: "A Content-Encoding this server does not decode.",
    416: "The Range lies outside the file; Content-Range says its size.",
    422: "A field is invalid; `errors` names each one.",
    429: "A per-owner cap refuses the request; Retry-After says when to try again.",
    500: "An unexpected error; the server log has the details.",
    503: "SQL or Redis does not answer; Retry-After says when to try again.",
}
_HEADERS = {
    401: {"WWW-Authenticate": "Bearer"},
    416: {"Content-Range": "bytes */<size of the file>"},
    429: {"Retry-After": "Seconds to wait."},
    503: {"Retry-After": "Seconds to wait."},
}
PROBLEM_REF = {"schema": {"$ref": "#/components/schemas/Problem"}}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The problem+json answers a route gives beyond those every route has (``_openapi`` adds those: 400, 413, 500,
    503; 401 under /v1; 404 with a path parameter; 422 with any parameter or body). For ``responses=`` of a route."""
    return {status: _response(status) for status in statuses}


def _response(status: int) -> dict[str, Any]:
    out: dict[str, Any] = {"description": _STATUSES.get(status, HTTPStatus(status).phrase), "content": {PROBLEM: PROBLEM_REF}}
    if status in _HEADERS:
        out["headers"] = {name: {"description": text, "schema": {"type": "string"}} for name, text in _HEADERS[status].items()}
    return out


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with every status an operation answers documented, errors as problem+json. No ``default``:
    a status not listed is a defect the schemathesis run of the test suite finds."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    problem_schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(problem_schema.pop("$defs", {}))
    schemas["Problem"] = problem_schema
    for model in SSE_PAYLOADS.values():  # referenced from the text/event-stream schema of /events
        schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    for path, operations in schema.get("paths", {}).items():
        for op in operations.values():
            answers = op.setdefault("responses", {})
            # The body-size middleware answers 400 and 413 before any route; any route may find SQL or Redis down.
            wanted = {400, 413, 500, 503}
            if path.startswith("/v1/"):
                wanted.add(401)
            if "{" in path:
                wanted.add(404)
            if op.get("parameters") or op.get("requestBody"):
                wanted.add(422)
            for status in sorted(wanted):
                if str(status) not in answers:
                    answers[str(status)] = _response(status)
            if "422" in answers:  # FastAPI's own 422 entry names its HTTPValidationError: ours is a problem
                answers["422"] = _response(422)
            for parameter in op.get("parameters", []):
                _not_nullable(parameter)
            if path == "/v1/code":
                for parameter in op.get("parameters", []):
                    if parameter["name"].lower() == "content-encoding":
                        parameter["schema"]["pattern"] = CONTENT_ENCODING
    _link(schema, ("/v1/jobs", "post"), "201", "/v1/jobs/{job_id}", "job_id", "id")
    _link(schema, ("/v1/jobs/{job_id}/retry", "post"), "201", "/v1/jobs/{job_id}", "job_id", "id")
    _link(schema, ("/v1/keys", "post"), "201", "/v1/keys/{key_id}", "key_id", "id")
    for status in ("200", "201"):
        _link(schema, ("/v1/code", "post"), status, "/v1/code/{digest}", "digest", "digest")
    app.openapi_schema = schema
    return schema


# What POST /v1/code decodes (any case, blanks around it); anything else answers 415.
CONTENT_ENCODING = r"^[ \t]*(?:[Gg][Zz][Ii][Pp]|[Ii][Dd][Ee][Nn][Tt][Ii][Tt][Yy])[ \t]*$"


def _not_nullable(parameter: dict[str, Any]) -> None:
    """An optional parameter is one left out, never one sent as null: FastAPI's ``anyOf: [X, null]`` becomes X, so a
    client generated from the schema does not send the text 'null'."""
    schema = parameter.get("schema", {})
    options = schema.get("anyOf")
    if isinstance(options, list):
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) == 1 and len(kept) < len(options):
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            parameter["schema"] = {**kept[0], **rest}


def _link(schema: dict[str, Any], source: tuple[str, str], status: str, prefix: str, parameter: str, field: str) -> None:
    """OpenAPI links from the response that creates a resource to every operation under ``prefix`` that takes its id,
    so clients and stateful tests know where the id goes."""
    paths = schema["paths"]
    answer = paths.get(source[0], {}).get(source[1], {}).get("responses", {}).get(status)
    if answer is None:
        return
    links = answer.setdefault("links", {})
    for path, operations in paths.items():
        if path == prefix or path.startswith(prefix + "/"):
            for op in operations.values():
                if "operationId" in op:
                    links[op["operationId"]] = {"operationId": op["operationId"],
                                                "parameters": {parameter: f"$response.body#/{field}"}}
