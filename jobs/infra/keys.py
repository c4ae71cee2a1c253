"""Tenant API keys: created and revoked by an admin, stored as SHA-256 digests, checked in constant time.

A key reads ``ty_<id>_<secret>``. The id finds the row; the digest of the whole key is then
compared with ``hmac.compare_digest``, so response timing says nothing about how much of a
guessed key was right. The secret is 256 random bits, which is why a fast hash is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import ApiKey, utcnow

PREFIX = "ty_"
_ID_HEX = 16
# Compared against when no row matches, so a wrong id costs the same as a wrong secret.
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


class KeyNotFound(LookupError):
    def __init__(self, key_id: str):
        super().__init__(f"API key {key_id} not found")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, owner: str, name: str, queues: list[str] | None = None, *,
               max_priority: int = 50, may_protect: bool = False) -> tuple[ApiKey, str]:
    """A new key for ``owner``, limited to ``queues`` when given, submitting at most at ``max_priority``;
    returns the row and the plain key, which is never stored or shown again."""
    key_id = secrets.token_hex(_ID_HEX // 2)
    plain = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    row = ApiKey(id=key_id, owner=owner, name=name, key_hash=hash_key(plain), queues=sorted(set(queues)) if queues is not None else None,
                 max_priority=max_priority, may_protect=may_protect)
    session.add(row)
    session.commit()
    session.refresh(row)
    return row, plain


def list_keys(session: Session, owner: str | None = None) -> list[ApiKey]:
    query = sa.select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if owner is not None:
        query = query.where(ApiKey.owner == owner)
    return list(session.exec(query).scalars())  # type: ignore[call-overload]


def revoke_key(session: Session, key_id: str) -> ApiKey:
    """Revoke at once (the next request with it answers 401); revoking twice is harmless."""
    row = session.get(ApiKey, key_id)
    if row is None:
        raise KeyNotFound(key_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.add(row)
        session.commit()
        session.refresh(row)
    return row


def _key_id(plain: str) -> str | None:
    if not plain.startswith(PREFIX):
        return None
    key_id, sep, _ = plain[len(PREFIX):].partition("_")
    return key_id if sep and len(key_id) == _ID_HEX else None


def live_key(session: Session, plain: str) -> ApiKey | None:
    """The row of a live key, or None for an unknown, wrong or revoked one."""
    key_id = _key_id(plain)
    row = session.get(ApiKey, key_id, populate_existing=True) if key_id else None
    stored = row.key_hash if row is not None else _DUMMY_HASH
    matches = hmac.compare_digest(hash_key(plain), stored)
    if row is None or not matches or row.revoked_at is not None:
        return None
    return row


def queue_problem(allowed: list[str] | None, queue: str) -> str | None:
    """Why a key limited to ``allowed`` queues (None: all) may not submit to ``queue``."""
    if allowed is None or queue in allowed:
        return None
    return f"this API key may submit to {', '.join(allowed) or 'no queue'} only, not {queue!r}"
