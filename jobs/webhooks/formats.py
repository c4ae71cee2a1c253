"""What a delivery posts: the body (json or slack), its headers and signature, and the retry schedule."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

FORMATS = ("json", "slack")
RETRY_FIRST_S, RETRY_CAP_S = 1.0, 600.0


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of ``TIMESTAMP.BODY`` keyed with the secret's UTF-8 bytes."""
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def retry_delay_s(tries: int) -> float:
    """Wait after the ``tries``-th failed try (1, 2, ...): about a second, doubling, capped at ten minutes."""
    return min(RETRY_CAP_S, RETRY_FIRST_S * 2.0 ** min(max(tries, 1) - 1, 30))


def retryable(status: int | None) -> bool:
    """Whether an answer (None: a timeout or connection error) is worth another try; a redirect or any other
    4xx says the receiver will not take it."""
    return status is None or status >= 500 or status in (408, 429)


def json_body(delivery_id: str, kind: str, at: datetime, payload: dict[str, Any]) -> dict[str, Any]:
    return {"id": delivery_id, "type": kind, "at": at.isoformat().replace("+00:00", "Z"), **payload}


def slack_body(kind: str, payload: dict[str, Any], public_url: str | None) -> dict[str, Any]:
    """One line a Slack incoming webhook shows as is: what, whose, how it ended, why, and where to look."""
    if "host" in payload:
        return {"text": _host_line(payload["host"], public_url)}
    subject = payload.get("job") or payload.get("sweep") or {}
    what = "sweep" if "sweep" in payload else "job"
    line = f"{what} {subject.get('name') or subject.get('id')} ({subject.get('owner')}): {subject.get('status')}"
    error = subject.get("error")
    if isinstance(error, dict) and (error.get("message") or error.get("type")):
        line += f": {(error.get('type') or 'error')}: {str(error.get('message') or '')[:300]}".rstrip(": ")
    elif kind == "job.preempted" and subject.get("reason"):
        line += f" ({str(subject['reason'])[:300]})"
    elif subject.get("message"):
        line += f": {str(subject['message'])[:300]}"
    if public_url:
        page = "sweeps" if what == "sweep" else "jobs"
        line += f" <{public_url.rstrip('/')}/#/{page}/{subject.get('id')}|open>"
    return {"text": line}


def _host_line(host: dict[str, Any], public_url: str | None) -> str:
    gpu = host.get("gpu")
    line = f"host {host.get('id')}" + (f" GPU {gpu}: quarantined" if gpu is not None else ": draining")
    line += f" ({str(host.get('reason') or '')[:300]}) by {host.get('by')}"
    return line + (f" <{public_url.rstrip('/')}/#/hosts|open>" if public_url else "")


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
