"""The synchronous torchyard client: one method per API call, typed results, problem+json errors
raised as exceptions, cursors followed for you, and a live event stream that resumes itself.

``Client`` is assembled from one class per part of the API: jobs and their code bundles (client.jobs,
client.code_bundles), live events (client.events), logs (client.logs), file downloads (client.downloads) and
webhooks (client.webhooks);
the smaller parts (health, sweeps, hosts, quotas, keys) are here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from torchyard.client.config import ClientConfig, load_config
from torchyard.client.downloads import DownloadsApi
from torchyard.client.errors import ApiError
from torchyard.client.events import EventsApi
from torchyard.client.http import api_path
from torchyard.client.jobs import load_spec
from torchyard.client.logs import LogsApi
from torchyard.client.models import ApiKey, Host, Quota, UsageRow
from torchyard.client.webhooks import WebhooksApi


class Client(EventsApi, LogsApi, DownloadsApi, WebhooksApi):
    """``Client(url, key)``; or ``Client.from_config()`` to read TORCHYARD_URL / TORCHYARD_API_KEY
    or ~/.config/torchyard/config.toml. Use as a context manager to close its connections."""

    @classmethod
    def from_config(cls, config: ClientConfig | None = None, **kwargs: Any) -> Client:
        config = config or load_config()
        return cls(config.url, config.api_key, **kwargs)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ health

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    def ready(self) -> dict[str, Any]:
        return self._json("GET", "/readyz")

    # ------------------------------------------------------------------ sweeps

    def create_sweep(self, sweep: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Start a sweep (POST /v1/sweeps); the answer is the sweep as a dict (its trials come as the controller
        creates them). Raises InvalidRequest naming the field of a bad space, method or metric."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/sweeps", json=sweep, headers=headers)

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        """A sweep with its trials: parameters, state, rung, metric values, and the best trial so far."""
        return self._json("GET", api_path("sweeps", sweep_id))

    def list_sweeps(self, *, limit: int = 50) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/sweeps", params={"limit": limit})["items"]

    def cancel_sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._json("POST", api_path("sweeps", sweep_id, "cancel"))

    def hosts(self) -> list[Host]:
        """The workers' hosts: GPUs (each with the job holding it, when the caller may see it) and CPU slots."""
        return [Host.model_validate(h) for h in self._json("GET", "/v1/hosts")["items"]]

    def host(self, host_id: str) -> Host:
        """One host with its state and ``history`` (drains, undrains, quarantines, clears)."""
        return Host.model_validate(self._json("GET", api_path("hosts", host_id)))

    def drain_host(self, host_id: str, reason: str) -> Host:
        """Drain a host (admin): nothing new is placed there; its running jobs checkpoint and are placed elsewhere."""
        return Host.model_validate(self._json("POST", api_path("hosts", host_id, "drain"), json={"reason": reason}))

    def undrain_host(self, host_id: str) -> Host:
        """Return a drained host to placement (admin)."""
        return Host.model_validate(self._json("POST", api_path("hosts", host_id, "undrain")))

    def clear_gpu(self, host_id: str, gpu: int) -> Host:
        """Return a quarantined GPU to placement (admin)."""
        return Host.model_validate(self._json("POST", api_path("hosts", host_id, "gpus", int(gpu), "clear")))

    # ------------------------------------------------------------------ quotas

    def quotas(self) -> list[Quota]:
        """Every owner's quota and use (the admin), or the caller's own."""
        return [Quota.model_validate(q) for q in self._json("GET", "/v1/quotas")["items"]]

    def set_quota(self, owner: str, gpus: int | None = None, cpu_slots: int | None = None) -> Quota:
        """Guarantee ``owner`` these GPUs and CPU slots (admin); None: no limit on that resource."""
        return Quota.model_validate(self._json("PUT", api_path("quotas", owner), json={"gpus": gpus, "cpu_slots": cpu_slots}))

    def delete_quota(self, owner: str) -> None:
        self._request("DELETE", api_path("quotas", owner))

    # ------------------------------------------------------------------ usage

    def usage(self, start: datetime | str | None = None, end: datetime | str | None = None, group_by: str = "owner") -> list[UsageRow]:
        """GPU-hours and CPU-slot-hours from the attempts, per ``group_by`` (owner, day, or owner,day) over [start, end):
        every owner's for the admin, the caller's own otherwise."""
        return [UsageRow.model_validate(r) for r in self._json("GET", "/v1/usage", params=_window(start, end, group_by))["items"]]

    def usage_csv(self, start: datetime | str | None = None, end: datetime | str | None = None, group_by: str = "owner") -> str:
        """The same as :meth:`usage`, as the API's CSV."""
        return self._request("GET", "/v1/usage", params=_window(start, end, group_by), headers={"Accept": "text/csv"}).text

    # ------------------------------------------------------------------ keys (admin)

    def create_key(self, owner: str, name: str, queues: list[str] | None = None, *, max_priority: int | None = None,
                   may_protect: bool = False) -> ApiKey:
        """A new key for ``owner`` (limited to ``queues`` when given, submitting at most at ``max_priority``); the secret
        is in ``.key`` and is shown only this once."""
        body: dict[str, Any] = {"owner": owner, "name": name, "may_protect": may_protect}
        if queues is not None:
            body["queues"] = queues
        if max_priority is not None:
            body["max_priority"] = max_priority
        return ApiKey.model_validate(self._json("POST", "/v1/keys", json=body))

    def list_keys(self) -> list[ApiKey]:
        body = self._json("GET", "/v1/keys")
        items = body["items"] if isinstance(body, dict) else body
        return [ApiKey.model_validate(k) for k in items]

    def revoke_key(self, key_id: str) -> None:
        self._request("DELETE", api_path("keys", key_id))


def _window(start: datetime | str | None, end: datetime | str | None, group_by: str) -> dict[str, str]:
    params = {"group_by": group_by}
    for name, value in (("from", start), ("to", end)):
        if value is not None:
            params[name] = value.isoformat() if isinstance(value, datetime) else value
    return params


__all__ = ["ApiError", "Client", "load_spec"]
