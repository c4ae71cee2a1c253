"""A job's logs: the text so far, or followed as it is written across the server's stream lifetimes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx

from torchyard.client.errors import ConnectionFailed, error_from_response
from torchyard.client.http import HttpSession, job_path

# How the server ends a followed log at its maximum lifetime (jobs.reads.job_logs.RECONNECT_MARKER): then a position, a newline.
_RECONNECT = "\x1etorchyard-reconnect "


class LogsApi(HttpSession):
    def logs(self, job_id: str, *, rank: int | str | None = None, tail: int | None = None, stream: str | None = None,
             attempt: int | None = None) -> str:
        """A log of the job's current (or given) attempt: every rank's output merged, each line prefixed
        ``[rank N]``; with ``rank`` that rank's stdout and stderr as printed (or only ``stream``, "stdout"
        or "stderr"); ``rank="launcher"`` for torchrun's own log."""
        params = _log_params(rank, tail, stream, attempt)
        return self._request("GET", job_path(job_id, "logs"), params=params, headers={"Accept": "text/plain"}).text

    def follow_logs(self, job_id: str, *, rank: int | str | None = None, tail: int | None = None, stream: str | None = None,
                    attempt: int | None = None) -> Iterator[str]:
        """Chunks of log text as they are written, until the attempt ends and the server closes the stream. A stream
        the server ends at its maximum lifetime is resumed where it stopped, on the same attempt."""
        params: dict[str, int | str] = {**_log_params(rank, tail, stream, attempt), "follow": "true"}
        while True:
            position: str | None = None
            try:
                with self._http.stream("GET", job_path(job_id, "logs"), params=params, headers={"Accept": "text/plain"},
                                       timeout=httpx.Timeout(self._http.timeout.connect, read=None)) as response:
                    if response.is_error:
                        response.read()
                        raise error_from_response(response)
                    if response.headers.get("X-Log-Attempt", "").isdigit():  # a resumed stream stays on this attempt
                        params["attempt"] = int(response.headers["X-Log-Attempt"])
                    held = ""  # text from a 0x1e on, until it is known not to be the reconnect marker
                    for chunk in response.iter_text():
                        text, held = _split_marker(held + chunk)
                        if text:
                            yield text
                    if held.startswith(_RECONNECT) and held.endswith("\n"):
                        position = held[len(_RECONNECT):].strip()
                    elif held:
                        yield held
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"log stream from {self.url} broke: {exc}") from exc
            if position is None:
                return
            params.pop("tail", None)
            params["position"] = position


def _split_marker(text: str) -> tuple[str, str]:
    """``text`` cut into what can be shown now and what may be the start of the reconnect marker (held back)."""
    at = text.rfind("\x1e")
    if at == -1:
        return text, ""
    tail = text[at:]
    if _RECONNECT.startswith(tail[:len(_RECONNECT)]) and "\n" not in tail[:-1]:
        return text[:at], tail
    return text, ""


def _log_params(rank: int | str | None, tail: int | None, stream: str | None, attempt: int | None) -> dict[str, int | str]:
    given = {"rank": rank, "tail": tail, "stream": stream, "attempt": attempt}
    return {k: v for k, v in given.items() if v is not None}
