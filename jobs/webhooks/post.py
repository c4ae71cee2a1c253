"""One try of one delivery: sign the body, connect to the checked address, POST, classify the answer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from jobs.settings import Settings
from jobs.webhooks import formats, ssrf
from jobs.webhooks.models import Webhook, WebhookDelivery

USER_AGENT = "torchyard-webhooks"


@dataclass(frozen=True)
class Result:
    status: int | None  # the receiver's HTTP status; None when none came back
    error: str | None  # None: delivered
    retry: bool  # a timeout, a connection error, a 5xx, 408 or 429: tried again later


def body_of(delivery: WebhookDelivery, hook: Webhook, settings: Settings) -> bytes:
    if hook.format == "slack":
        return formats.encode(formats.slack_body(delivery.type, delivery.payload, settings.public_url))
    return formats.encode(formats.json_body(delivery.id, delivery.type, delivery.at, delivery.payload))


def headers_of(delivery: WebhookDelivery, secret: str, body: bytes, timestamp: str | None = None) -> dict[str, str]:
    timestamp = timestamp or str(int(time.time()))
    return {"Content-Type": "application/json", "User-Agent": USER_AGENT, "X-Torchyard-Event": delivery.type,
            "X-Torchyard-Delivery": delivery.id, "X-Torchyard-Timestamp": timestamp,
            "X-Torchyard-Signature": formats.signature(secret, timestamp, body)}


def _pinned(url: str, ip: ssrf.IPAddress) -> tuple[httpx.URL, str]:
    """The URL aimed at ``ip`` itself, and the Host header (the name, with a port that is not the default)."""
    parts = urlsplit(url)
    original = httpx.URL(url)
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if parts.port is None else f"{shown}:{parts.port}"
    return original.copy_with(host=str(ip)), host_header


def send(client: httpx.Client, hook: Webhook, delivery: WebhookDelivery, secret: str, settings: Settings,
         allow: ssrf.AllowList) -> Result:
    """POST the delivery once. Never follows a redirect, never uses a proxy from the environment."""
    parts = urlsplit(hook.url)
    host = parts.hostname or ""
    try:
        ip = ssrf.pin(host, parts.port or (443 if parts.scheme == "https" else 80), allow)
    except ssrf.Refused as exc:
        return Result(None, f"refused: {exc}", retry=False)
    except OSError as exc:
        return Result(None, f"{host} does not resolve: {exc}", retry=True)
    body = body_of(delivery, hook, settings)
    target, host_header = _pinned(hook.url, ip)
    # TLS still names (SNI) and verifies the host the URL names, although the connection goes to the pinned address.
    extensions = {"sni_hostname": host} if parts.scheme == "https" and not ssrf.is_address(host) else {}
    try:
        answer = client.post(target, content=body, headers={**headers_of(delivery, secret, body), "Host": host_header},
                             extensions=extensions)
    except httpx.TimeoutException:
        return Result(None, f"no answer within {settings.webhook_timeout_s:g} s", retry=True)
    except httpx.HTTPError as exc:
        return Result(None, f"connection error: {exc.__class__.__name__}: {exc}"[:500], retry=True)
    if 200 <= answer.status_code < 300:
        return Result(answer.status_code, None, retry=False)
    why = "a redirect (not followed)" if 300 <= answer.status_code < 400 else answer.reason_phrase or "error"
    return Result(answer.status_code, f"HTTP {answer.status_code} {why}", retry=formats.retryable(answer.status_code))


def make_client(settings: Settings) -> httpx.Client:
    return httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False, trust_env=False,
                        limits=httpx.Limits(max_connections=settings.webhook_threads, max_keepalive_connections=0))
