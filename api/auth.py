"""Bearer-key authentication. Every job belongs to the owner of the key that submitted it.

Keys are the admin token (TORCHYARD_ADMIN_TOKEN, owner "admin") or tenant keys an admin
created (``POST /v1/keys``), stored as digests and compared in constant time (jobs.keys).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session

from jobs import keys
from jobs.settings import Settings

ADMIN_OWNER = "admin"
_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from POST /v1/keys, or the admin token from TORCHYARD_ADMIN_TOKEN.",
)


@dataclass(frozen=True)
class Principal:
    owner: str
    is_admin: bool
    queues: tuple[str, ...] | None = None  # the key's queue allow-list; None: every queue of TORCHYARD_QUEUES

    def queue_problem(self, queue: str) -> str | None:
        return keys.queue_problem(list(self.queues) if self.queues is not None else None, queue)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def authenticate(token: str, settings: Settings, engine: Engine | None = None) -> Principal | None:
    admin = settings.admin_token
    # Compare digests in constant time so response timing says nothing about the key.
    if admin and hmac.compare_digest(hash_key(token), hash_key(admin)):
        return Principal(owner=ADMIN_OWNER, is_admin=True)
    if engine is None or not token.startswith(keys.PREFIX):
        return None
    # A short session of its own: streaming routes must not hold a connection for the whole stream.
    with Session(engine) as session:
        row = keys.live_key(session, token)
    if row is None:
        return None
    return Principal(owner=row.owner, is_admin=False, queues=tuple(row.queues) if row.queues is not None else None)


def still_authorized(request: Request, principal: Principal) -> bool:
    """Whether the request's key still authenticates as ``principal``'s owner: long-lived streams ask at
    every poll, so a revoked key's stream ends within one poll interval."""
    credentials = request.headers.get("authorization", "")
    scheme, _, token = credentials.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    again = authenticate(token.strip(), request.app.state.settings, request.app.state.engine)
    return again is not None and again.owner == principal.owner


def current_principal(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> Principal:
    unauthorized = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <key>'", headers=unauthorized)
    principal = authenticate(credentials.credentials, request.app.state.settings, request.app.state.engine)
    if principal is None:
        raise HTTPException(401, "invalid or revoked API key", headers=unauthorized)
    request.state.owner = principal.owner  # for the access log
    return principal


def admin_principal(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.is_admin:
        raise HTTPException(403, "this needs the admin key (TORCHYARD_ADMIN_TOKEN)")
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]
AdminDep = Annotated[Principal, Depends(admin_principal)]
