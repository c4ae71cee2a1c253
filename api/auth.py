"""Bearer-key authentication. Every job belongs to the owner of the key that submitted it."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.deps import SettingsDep
from jobs.settings import Settings

ADMIN_OWNER = "admin"
_bearer = HTTPBearer(auto_error=False, description="An API key: the admin token from TORCHYARD_ADMIN_TOKEN.")


@dataclass(frozen=True)
class Principal:
    owner: str
    is_admin: bool


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def authenticate(token: str, settings: Settings) -> Principal | None:
    admin = settings.admin_token
    # Compare digests in constant time so response timing says nothing about the key.
    if admin and hmac.compare_digest(hash_key(token), hash_key(admin)):
        return Principal(owner=ADMIN_OWNER, is_admin=True)
    return None


def current_principal(
    settings: SettingsDep, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> Principal:
    unauthorized = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <key>'", headers=unauthorized)
    principal = authenticate(credentials.credentials, settings)
    if principal is None:
        raise HTTPException(401, "invalid API key", headers=unauthorized)
    return principal
