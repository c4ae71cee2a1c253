"""A webhook receiver on loopback for the tests: records every request; a path can fail its first tries or hang."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() at arrival
    answered: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signed_by(self, secret: str) -> bool:
        mac = hmac.new(secret.encode(), f"{self.headers['x-torchyard-timestamp']}.".encode() + self.body, hashlib.sha256)
        return hmac.compare_digest(self.headers["x-torchyard-signature"], "sha256=" + mac.hexdigest())


@dataclass
class Receiver:
    fail_first: dict[str, int] = field(default_factory=dict)  # path -> how many requests answer 500 first
    hang: set[str] = field(default_factory=set)  # paths that never answer (until close)
    redirect: dict[str, str] = field(default_factory=dict)  # path -> where a 302 sends the client
    got: list[Received] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path in receiver.hang:
                    receiver.got.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time(), 0))
                    receiver.released.wait(300)
                    return
                left = receiver.fail_first.get(self.path, 0)
                code = 302 if self.path in receiver.redirect else 500 if left > 0 else 200
                receiver.fail_first[self.path] = left - 1
                receiver.got.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time(), code))
                self.send_response(code)
                if code == 302:
                    self.send_header("Location", receiver.redirect[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def accepted(self, path: str) -> dict[str, Received]:
        """The requests answered 200 on ``path``, one per X-Torchyard-Delivery (a receiver drops repeats)."""
        return {r.headers["x-torchyard-delivery"]: r for r in self.got if r.path == path and r.answered == 200}

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
