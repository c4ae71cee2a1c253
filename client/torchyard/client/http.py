"""The connection every API call goes through: the base URL, the key's Authorization header, and the mapping of
transport failures and problem+json answers to the client's exceptions."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx

from torchyard.client.errors import ConnectionFailed, error_from_response
from torchyard.version import VERSION

USER_AGENT = f"torchyard-client/{VERSION}"
log = logging.getLogger(__name__)

# What a request sent on a connection the server had just closed meets, before any answer.
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def segment(text: str) -> str:
    """``text`` as one URL path segment. Unquoted, an id such as ``../keys/k1`` (from a script's input, a webhook
    payload) would be resolved by httpx to another route, called with this key; quote leaves dots, so a segment that
    is all dots is escaped too."""
    quoted = quote(text, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def api_path(collection: str, ident: str, *rest: str | int) -> str:
    """``/v1/{collection}/{ident}/{rest...}``, the caller's ``ident`` as one segment (``rest`` is the client's own)."""
    return "/".join([f"/v1/{collection}/{segment(ident)}", *map(str, rest)])


def job_path(job_id: str, *rest: str | int) -> str:
    return api_path("jobs", job_id, *rest)


def _resendable(method: str, kwargs: dict[str, Any]) -> bool:
    """Methods HTTP calls idempotent, and a POST carrying an Idempotency-Key (the API answers a resend with the
    first answer); never a body that was a stream, which the first send used up."""
    if not isinstance(kwargs.get("content", b""), bytes | str) or "files" in kwargs:
        return False
    headers = {k.lower() for k in (kwargs.get("headers") or {})}
    return method.upper() in _IDEMPOTENT or (method.upper() == "POST" and "idempotency-key" in headers)


class HttpSession:
    """The base of ``Client``: one pooled httpx connection to ``url``, sending ``key`` as a bearer token."""

    def __init__(self, url: str, key: str | None = None, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            try:
                response = self._http.request(method, path, **kwargs)
            except _STALE as exc:
                if not _resendable(method, kwargs):
                    raise
                # A pooled connection the server closed (its keep-alive ran out) just as this request went out: the
                # server answered nothing, so a request that may be sent twice goes once more on a new connection.
                log.debug("%s %s: %s on a reused connection; sending it again", method, path, exc)
                response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach the torchyard API at {self.url}: {exc}") from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()
