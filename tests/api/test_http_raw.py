"""Requests uvicorn itself parses, sent byte for byte to a real API process: every error body is problem+json,
and OPTIONS and 405 name every method of a path."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from tests.helpers import Services


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ", 2)[1]), {k.lower(): v for k, v in headers.items()}, body


def test_malformed_requests_get_problem_json_and_methods_are_listed(services: Services) -> None:
    services.start_api()
    auth = services.headers["Authorization"]
    malformed = [
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Length: abc\r\n\r\n{{}}",
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}",
        "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nthis line has no colon\r\n\r\n",
        "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        "NOT-HTTP\r\n\r\n",
    ]
    for request in malformed:
        status, headers, body = raw(services.url, request.encode())
        assert status == 400, (request, status, body)
        assert headers["content-type"] == "application/problem+json", (request, headers)
        problem = json.loads(body)
        assert problem["status"] == 400 and problem["title"] == "Bad Request" and problem["detail"]

    status, headers, body = raw(services.url, b"OPTIONS /v1/jobs/abc HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 204 and headers["allow"] == "DELETE, GET, OPTIONS, PATCH" and body == b""
    status, headers, body = raw(services.url, f"PUT /v1/keys HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                                              "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
    assert status == 405 and headers["allow"] == "GET, OPTIONS, POST"
    assert headers["content-type"] == "application/problem+json" and json.loads(body)["status"] == 405
