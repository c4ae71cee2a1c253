"""uvicorn's HTTP/1.1 protocols with one change: a request the parser refuses (a Content-Length that is not a
number, a header line without a colon...) is answered with a problem+json 400, like every other error, instead of
uvicorn's plain text. uvicorn answers it before the app sees anything, so no middleware can.

``PROTOCOL`` is the one uvicorn would pick itself: httptools where it is installed (the images), else h11.
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.middleware import problem_bytes


def _body(msg: str) -> bytes:
    return problem_bytes(400, "Bad Request", f"malformed HTTP request: {msg}")


class ProblemH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        body = _body(msg)
        headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


PROTOCOL: type = ProblemH11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: uvicorn would use h11
    pass
else:
    class ProblemHttpToolsProtocol(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            body = _body(msg)
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head += [b"content-type: application/problem+json\r\n", b"content-length: " + str(len(body)).encode() + b"\r\n",
                     b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    PROTOCOL = ProblemHttpToolsProtocol
