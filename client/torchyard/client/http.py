"""The connection every API call goes through: the base URL, the key's Authorization header, and the mapping of
transport failures and problem+json answers to the client's exceptions."""

from __future__ import annotations

from typing import Any

import httpx

from torchyard.client.errors import ConnectionFailed, error_from_response
from torchyard.version import VERSION

USER_AGENT = f"torchyard-client/{VERSION}"


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
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach the torchyard API at {self.url}: {exc}") from exc
        if response.is_error:
            raise error_from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()
