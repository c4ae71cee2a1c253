"""Bearer-key authentication. Every job belongs to the owner of the key that submitted it.

Keys are the admin token (TORCHYARD_ADMIN_TOKEN, owner "admin") or tenant keys an admin
created (``POST /v1/keys``), stored as digests and compared in constant time (jobs.infra.keys).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from api.key_cache import KeyCache
from jobs.infra import keys
from jobs.settings import Settings

ADMIN_OWNER = "admin"
EVERY_OWNER = "*"  # a list's owner= for every owner's
_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from POST /v1/keys, or the admin token from TORCHYARD_ADMIN_TOKEN.",
)


@dataclass(frozen=True)
class Principal:
    owner: str
    is_admin: bool
    queues: tuple[str, ...] | None = None  # the key's queue allow-list; None: every queue of TORCHYARD_QUEUES
    max_priority: int = 100  # the admin submits at any priority
    may_protect: bool = True  # and may submit jobs that are not preemptible

    @property
    def scope(self) -> str | None:
        """Whose jobs (and usage, quotas, jobs on hosts) this key sees and acts on by id: its owner's, or every owner's
        (None) for the admin, who runs the box: a tenant's job holding a GPU is one the admin can look at, cancel,
        reprioritise and delete."""
        return None if self.is_admin else self.owner

    def listed_owner(self, owner: str | None) -> str | None:
        """Whose jobs a list shows for ``owner=`` (None: every owner's): the key's own by default; the admin may name an
        owner or ``*``; any other key only its own (403)."""
        if owner is None:
            return self.owner
        if not self.is_admin and owner != self.owner:
            raise HTTPException(403, "only the admin key lists another owner's jobs")
        return None if owner == EVERY_OWNER else owner

    def queue_problem(self, queue: str) -> str | None:
        return keys.queue_problem(list(self.queues) if self.queues is not None else None, queue)

    def priority_problem(self, priority: int) -> str | None:
        if priority > self.max_priority:
            return (f"{priority} is above this key's max_priority {self.max_priority}; "
                    "ask the admin for a key with a higher max_priority")
        return None

    def spec_problems(self, queue: str, priority: int, preemptible: bool) -> list[tuple[str, str]]:
        """What this key may not ask of a spec, as (field, words)."""
        found = []
        if why := self.queue_problem(queue):
            found.append(("queue", why))
        if why := self.priority_problem(priority):
            found.append(("priority", why))
        if not preemptible and not self.may_protect:
            found.append(("preemptible", "this key may not submit jobs that cannot be preempted; "
                                         "ask the admin for a key created with may_protect"))
        return found


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@lru_cache(maxsize=4)
def _admin_digest(admin: str) -> str:
    return hash_key(admin)  # once per admin token, not per request


def _admin(token: str, settings: Settings) -> Principal | None:
    admin = settings.admin_token
    # Compare digests in constant time so response timing says nothing about the key.
    if admin and hmac.compare_digest(hash_key(token), _admin_digest(admin)):
        return Principal(owner=ADMIN_OWNER, is_admin=True)
    return None


def _from_sql(token: str, engine: Engine) -> tuple[str, Principal] | None:
    # A short session of its own: streaming routes must not hold a connection for the whole stream.
    with Session(engine) as session:
        row = keys.live_key(session, token)
    if row is None:
        return None
    return row.id, Principal(owner=row.owner, is_admin=False, queues=tuple(row.queues) if row.queues is not None else None,
                             max_priority=row.max_priority, may_protect=row.may_protect)


def authenticate(token: str, settings: Settings, engine: Engine | None = None) -> Principal | None:
    """The principal of ``token``, always from SQL for a tenant key (no cache): for checks that must see a revocation now."""
    if (admin := _admin(token, settings)) is not None:
        return admin
    if engine is None or not token.startswith(keys.PREFIX):
        return None
    found = _from_sql(token, engine)
    return found[1] if found else None


def key_cache(request: Request) -> KeyCache[Principal]:
    cache = getattr(request.app.state, "key_cache", None)
    if cache is None:
        cache = request.app.state.key_cache = KeyCache[Principal](request.app.state.settings.key_cache_s)
    return cache


def still_authorized(request: Request, principal: Principal) -> bool:
    """Whether the request's key still authenticates as ``principal``'s owner: long-lived streams ask at
    every poll, so a revoked key's stream ends within one poll interval."""
    credentials = request.headers.get("authorization", "")
    scheme, _, token = credentials.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    again = authenticate(token.strip(), request.app.state.settings, request.app.state.engine)
    return again is not None and again.owner == principal.owner


async def current_principal(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> Principal:
    """Async, so a request whose key is the admin's or was verified within TORCHYARD_KEY_CACHE_S costs no
    thread-pool hop; only a key this process has not seen lately is looked up in SQL (in a thread)."""
    unauthorized = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <key>'", headers=unauthorized)
    token, settings = credentials.credentials, request.app.state.settings
    principal = _admin(token, settings)
    if principal is None and token.startswith(keys.PREFIX):
        cache = key_cache(request)
        principal = cache.get(token)
        if principal is None:
            found = await run_in_threadpool(_from_sql, token, request.app.state.engine)
            if found is not None:
                cache.put(token, *found)
                principal = found[1]
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
