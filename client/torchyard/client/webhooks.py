"""Webhooks: subscribe a URL to job and sweep events, list and remove them, and see what became of each delivery."""

from __future__ import annotations

from typing import Any

from torchyard.client.http import HttpSession, api_path


class WebhooksApi(HttpSession):
    def create_webhook(self, url: str, events: list[str], *, format: str = "json", secret: str | None = None) -> dict[str, Any]:
        """Subscribe ``url`` to ``events`` (job.started, job.succeeded, job.failed, job.cancelled, job.preempted,
        sweep.finished). The answer's ``secret`` signs every delivery and is shown only this once. Raises
        InvalidRequest naming ``url`` for an address the service does not post to."""
        body: dict[str, Any] = {"url": url, "events": events, "format": format}
        if secret is not None:
            body["secret"] = secret
        return self._json("POST", "/v1/webhooks", json=body)

    def list_webhooks(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/webhooks")["items"]

    def delete_webhook(self, webhook_id: str) -> None:
        self._request("DELETE", api_path("webhooks", webhook_id))

    def webhook_deliveries(self, webhook_id: str) -> list[dict[str, Any]]:
        """The webhook's latest deliveries, newest first: event, status, tries, last HTTP status and error."""
        return self._json("GET", api_path("webhooks", webhook_id, "deliveries"))["items"]
