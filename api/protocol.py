"""uvicorn's HTTP/1.1 protocol with one change: a request h11 cannot parse (a Content-Length that is not a number,
a header line without a colon...) is answered with a problem+json 400, like every other error, instead of
uvicorn's plain text. uvicorn answers it before the app sees anything, so no middleware can."""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.middleware import problem_bytes


class ProblemH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        body = problem_bytes(400, "Bad Request", f"malformed HTTP request: {msg}")
        headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
