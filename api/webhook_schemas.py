"""Request and response bodies of /v1/webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.webhooks.models import Webhook, WebhookDelivery

EventType = Literal["job.started", "job.succeeded", "job.failed", "job.cancelled", "job.preempted", "sweep.finished",
                    "host.drained", "gpu.quarantined"]  # the last two reach the admin's webhooks only


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., min_length=1, max_length=2048, pattern=r"^[Hh][Tt][Tt][Pp][Ss]?://",
                     description="http:// or https:// address the events are POSTed to; loopback, private, link-local and "
                                 "metadata addresses are refused unless TORCHYARD_WEBHOOK_ALLOW_HOSTS allows them.")
    events: list[EventType] = Field(..., min_length=1, max_length=8, description="Event types to send.")
    format: Literal["json", "slack"] = Field("json", description="json: the event object; slack: {\"text\": one line}.")
    secret: str | None = Field(None, min_length=16, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$",
                               description="Signing secret; generated when omitted. Shown only in this answer.")


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    format: str
    owner: str
    created_at: datetime

    @classmethod
    def of(cls, row: Webhook) -> WebhookOut:
        return cls(id=row.id, url=row.url, events=list(row.events), format=row.format, owner=row.owner,
                   created_at=row.created_at)


class WebhookCreated(WebhookOut):
    secret: str = Field(..., description="The signing secret; not shown again.")


class WebhookList(BaseModel):
    items: list[WebhookOut]


class DeliveryOut(BaseModel):
    id: str = Field(..., description="The X-Torchyard-Delivery header, the same on every try.")
    event: str
    status: Literal["pending", "delivered", "failed"]
    tries: int
    last_status: int | None = Field(None, description="The receiver's HTTP status at the last try.")
    error: str | None = Field(None, description="What went wrong at the last try.")
    at: datetime = Field(..., description="When the event happened.")
    next_try_at: datetime | None = None
    delivered_at: datetime | None = None

    @classmethod
    def of(cls, row: WebhookDelivery) -> DeliveryOut:
        return cls(id=row.id, event=row.type, status=row.status, tries=row.tries, last_status=row.last_status,  # type: ignore[arg-type]
                   error=row.last_error, at=row.at, next_try_at=row.next_at if row.status == "pending" else None,
                   delivered_at=row.delivered_at)


class DeliveryList(BaseModel):
    items: list[DeliveryOut]
