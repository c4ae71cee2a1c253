"""Webhooks and their deliveries in SQL: create, list, remove; the fan-out of the outbox; a try's result."""

from __future__ import annotations

import secrets as token_source
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session

from jobs.infra.secrets import seal, unseal
from jobs.reads import job_lookup
from jobs.settings import Settings
from jobs.store.models import new_job_id, utcnow
from jobs.webhooks import formats
from jobs.webhooks.models import Webhook, WebhookDelivery, WebhookEvent

# The admin's webhooks hear every owner's events (api.auth.ADMIN_OWNER is the same name).
ADMIN_OWNER = "admin"
DELIVERIES_SHOWN = 100
KEPT_DAYS = 7  # finished deliveries are shown (GET .../deliveries) this long, then removed


class WebhookNotFound(job_lookup.JobNotFound):
    """A 404, as for jobs: another owner's webhook is answered as a missing one."""

    def __init__(self, webhook_id: str):
        LookupError.__init__(self, f"webhook {webhook_id} not found")


def create(session: Session, settings: Settings, owner: str, url: str, events: list[str], fmt: str,
           secret: str | None) -> tuple[Webhook, str]:
    """Store a webhook; returns it and its secret in clear (the only time it is shown). SecretsUnavailable
    without TORCHYARD_SECRETS_KEY: the secret must be kept, encrypted, for the sender to sign with."""
    plain = secret or token_source.token_urlsafe(32)
    row = Webhook(id=new_job_id(), owner=owner, url=url, events=sorted(set(events)), format=fmt,
                  secret_token=seal(plain, settings))
    session.add(row)
    session.commit()
    session.refresh(row)
    return row, plain


def secret_of(row: Webhook, settings: Settings) -> str:
    return unseal(row.secret_token, settings)


def _mine(owner: str) -> list[sa.ColumnElement[bool]]:
    return [] if owner == ADMIN_OWNER else [Webhook.owner == owner]  # type: ignore[list-item]


def list_for(session: Session, owner: str) -> list[Webhook]:
    """The key's webhooks (the admin's: every owner's), oldest first."""
    return list(session.exec(sa.select(Webhook).where(*_mine(owner)).order_by(Webhook.id)).scalars())  # type: ignore[call-overload]


def get(session: Session, owner: str, webhook_id: str) -> Webhook:
    row = session.get(Webhook, webhook_id)
    if row is None or (owner != ADMIN_OWNER and row.owner != owner):
        raise WebhookNotFound(webhook_id)
    return row


def remove(session: Session, owner: str, webhook_id: str) -> None:
    """Delete the webhook and its deliveries: nothing more is posted for it."""
    get(session, owner, webhook_id)
    session.exec(sa.delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id))  # type: ignore[call-overload]
    session.exec(sa.delete(Webhook).where(Webhook.id == webhook_id))  # type: ignore[call-overload]
    session.commit()


def deliveries(session: Session, owner: str, webhook_id: str) -> list[WebhookDelivery]:
    """The webhook's latest deliveries, newest first."""
    get(session, owner, webhook_id)
    return list(session.exec(sa.select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)  # type: ignore[call-overload]
                             .order_by(WebhookDelivery.id.desc()).limit(DELIVERIES_SHOWN)).scalars())  # type: ignore[attr-defined]


def subscribes(hook: Webhook, event: WebhookEvent) -> bool:
    """Whether the webhook hears the event: its type, its owner's (the admin's hear all), and not from before it."""
    return (event.type in hook.events and (hook.owner == ADMIN_OWNER or hook.owner == event.owner)
            and event.at >= hook.created_at)


def fan_out(session: Session, limit: int = 500) -> int:
    """Turn the oldest outbox events into one delivery per subscribing webhook and remove them, in the caller's
    transaction (the caller commits, with its lease check). Returns how many events it took."""
    found = list(session.exec(sa.select(WebhookEvent).order_by(WebhookEvent.id).limit(limit)).scalars())  # type: ignore[call-overload, arg-type]
    if not found:
        return 0
    hooks = list(session.exec(sa.select(Webhook)).scalars())  # type: ignore[call-overload]
    for event in found:
        for hook in hooks:
            if subscribes(hook, event):
                session.add(WebhookDelivery(id=new_job_id(), webhook_id=hook.id, type=event.type, at=event.at,
                                            payload=event.payload, next_at=event.at))
    session.exec(sa.delete(WebhookEvent).where(WebhookEvent.id <= found[-1].id))  # type: ignore[call-overload, operator]
    return len(found)


@dataclass(frozen=True)
class Due:
    delivery: WebhookDelivery
    hook: Webhook


def due(session: Session, busy: set[str], limit: int, webhook_id: str | None = None) -> list[Due]:
    """Pending deliveries whose time has come, oldest first, at most one per webhook and none of a ``busy`` one
    (``webhook_id``: of that webhook only)."""
    only = [] if webhook_id is None else [WebhookDelivery.webhook_id == webhook_id]
    rows = session.exec(sa.select(WebhookDelivery, Webhook).join(Webhook, Webhook.id == WebhookDelivery.webhook_id)  # type: ignore[call-overload, arg-type]
                        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_at <= utcnow(), *only)
                        .order_by(WebhookDelivery.next_at, WebhookDelivery.id).limit(limit * 20)).all()
    picked: dict[str, Due] = {}
    for delivery, hook in rows:
        if hook.id not in busy and hook.id not in picked and len(picked) < limit:
            picked[hook.id] = Due(delivery, hook)
    return list(picked.values())


def record_try(session: Session, delivery: WebhookDelivery, *, status: int | None, error: str | None, retry: bool,
               max_tries: int) -> str:
    """Write one try's result to the caller's transaction; returns the delivery's new status."""
    tries = delivery.tries + 1
    ok = error is None
    again = not ok and retry and tries < max_tries
    state = "delivered" if ok else "pending" if again else "failed"
    now = utcnow()
    session.exec(sa.update(WebhookDelivery).where(WebhookDelivery.id == delivery.id, WebhookDelivery.status == "pending")  # type: ignore[call-overload]
                 .values(status=state, tries=tries, last_status=status, last_error=None if ok else (error or "")[:1000],
                         next_at=now + timedelta(seconds=formats.retry_delay_s(tries)) if again else now,
                         delivered_at=now if ok else None))
    return state


def prune(session: Session, now: datetime | None = None) -> int:
    """Remove deliveries that ended more than KEPT_DAYS ago, in the caller's transaction; returns how many."""
    before = (now or utcnow()) - timedelta(days=KEPT_DAYS)
    return session.exec(sa.delete(WebhookDelivery).where(  # type: ignore[call-overload]
        WebhookDelivery.status != "pending", WebhookDelivery.next_at < before)).rowcount
