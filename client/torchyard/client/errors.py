"""Errors the client raises. Every HTTP error carries the problem+json ``detail`` of the API."""

from __future__ import annotations

from typing import Any

import httpx


class TorchyardError(Exception):
    """Base class of everything the client raises on purpose."""


class ConnectionFailed(TorchyardError):
    """The API did not answer (refused, DNS, TLS, timeout)."""


class ApiError(TorchyardError):
    """The API answered with an error status; ``detail`` is its problem+json detail."""

    status_code: int = 0

    def __init__(self, status_code: int, detail: str, body: Any = None, *, method: str = "", url: str = ""):
        self.status_code, self.detail, self.body, self.method, self.url = status_code, detail, body, method, url
        super().__init__(f"{status_code}: {detail}")

    @property
    def problems(self) -> list[dict[str, str]]:
        """Per-field problems of a 422 (``[{"field", "message"}]``), empty otherwise."""
        if isinstance(self.body, dict) and isinstance(self.body.get("errors"), list):
            return self.body["errors"]
        return []


class Unauthorized(ApiError):
    status_code = 401


class Forbidden(ApiError):
    status_code = 403


class NotFound(ApiError):
    status_code = 404


class Conflict(ApiError):
    status_code = 409


class InvalidRequest(ApiError):
    """422: the spec or a query parameter cannot be accepted; ``problems`` names the fields."""

    status_code = 422


_BY_STATUS: dict[int, type[ApiError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 422: InvalidRequest}


def error_from_response(response: httpx.Response) -> ApiError:
    """Build the matching ApiError; tolerate bodies that are not problem+json (a proxy's HTML page)."""
    body: Any = None
    detail = response.reason_phrase or f"HTTP {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        if text:
            detail = text[:500]
    else:
        if isinstance(body, dict) and body.get("detail"):
            detail = str(body["detail"])
    cls = _BY_STATUS.get(response.status_code, ApiError)
    request = response.request
    return cls(response.status_code, detail, body, method=request.method, url=str(request.url))
