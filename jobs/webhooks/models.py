"""The webhook tables: the outbox of events, the subscriptions and their deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import JSON, Column, Field, SQLModel

from jobs.store.models import UTCDateTime, _ts, utcnow


class WebhookEvent(SQLModel, table=True):
    """The outbox: one row per event, inserted in the transaction of the change it reports, removed once the
    sender has turned it into deliveries (in that sender's own transaction)."""

    __tablename__ = "webhook_events"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    type: str = Field(max_length=32)
    owner: str = Field(max_length=64)
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class Webhook(SQLModel, table=True):
    __tablename__ = "webhooks"
    __table_args__ = (sa.Index("ix_webhooks_owner_id", "owner", "id"),)

    id: str = Field(primary_key=True, max_length=32)
    owner: str = Field(max_length=64)
    url: str = Field(sa_column=Column(sa.Text, nullable=False))
    events: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    format: str = Field(max_length=16)
    # The signing secret, a Fernet token under TORCHYARD_SECRETS_KEY (jobs.infra.secrets): the sender needs it in clear.
    secret_token: str = Field(sa_column=Column(sa.Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))


class WebhookDelivery(SQLModel, table=True):
    __tablename__ = "webhook_deliveries"
    # The sender's scan (pending, due first) and a webhook's listing are each one index range.
    __table_args__ = (sa.Index("ix_webhook_deliveries_status_next_at", "status", "next_at"),
                      sa.Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"))

    id: str = Field(primary_key=True, max_length=32)
    webhook_id: str = Field(max_length=32)
    type: str = Field(max_length=32)
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    payload: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    status: str = Field(default="pending", max_length=16)
    tries: int = 0
    next_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    last_status: int | None = None
    last_error: str | None = Field(default=None, sa_column=Column(sa.Text, nullable=True))
    created_at: datetime = Field(default_factory=utcnow, sa_column=Column(UTCDateTime(), nullable=False))
    delivered_at: datetime | None = _ts()
