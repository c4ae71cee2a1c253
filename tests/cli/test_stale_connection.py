"""A pooled connection the server closes as the next request goes out (its keep-alive ran out between two polls):
the client sends a request that may be sent twice once more on a new connection, and never resends one that
may not. A real socket server closes the connection after reading the request, as a server whose idle timer
fired at that moment does."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from torchyard.client.errors import ConnectionFailed
from torchyard.client.http import HttpSession


class ClosingServer:
    """Answers each connection's first request; reads the second and closes without an answer."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> str | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        line = head.split(b"\r\n")[0].decode()
        self.requests.append(line)
        return line

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            if self._read_request(conn) is None:
                return
            body = json.dumps({"served": len(self.requests)}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: keep-alive\r\n\r\n" + body)
            self._read_request(conn)  # then closed, unanswered

    def close(self) -> None:
        # Shut down first: that wakes the thread blocked in accept(), which closing alone does not. A thread left
        # blocked there could, once its call was restarted, accept on the next test's server (the same fd number).
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=30)


@pytest.fixture
def server() -> Iterator[ClosingServer]:
    s = ClosingServer()
    yield s
    s.close()


def test_a_get_on_a_connection_the_server_just_closed_is_sent_again(server: ClosingServer) -> None:
    session = HttpSession(server.url)
    assert session._json("GET", "/v1/jobs/j1") == {"served": 1}
    # Same pooled connection: the server reads this and closes; the client sends it again on a new one.
    assert session._json("GET", "/v1/jobs/j1") == {"served": 3}
    assert server.requests == ["GET /v1/jobs/j1 HTTP/1.1"] * 3


def test_a_post_with_an_idempotency_key_is_sent_again_one_without_is_not(server: ClosingServer) -> None:
    session = HttpSession(server.url)
    session._json("GET", "/healthz")
    assert session._json("POST", "/v1/jobs", json={"name": "x"}, headers={"Idempotency-Key": "k1"}) == {"served": 3}
    session._json("GET", "/healthz")
    with pytest.raises(ConnectionFailed, match="cannot reach the torchyard API"):
        session._json("POST", "/v1/jobs", json={"name": "x"})
    # The keyed POST went out twice, the one without a key once: the server may have acted on it, so it is the
    # user's to retry.
    methods = [r.split()[0] for r in server.requests]
    assert methods == ["GET", "POST", "POST", "GET", "GET", "POST"]
