"""/v1/keys: tenant API keys, managed by the admin."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response

from api.auth import ADMIN_OWNER, AdminDep, key_cache
from api.deps import SessionDep, SettingsDep
from api.errors import responses
from api.request_bodies import KeyCreate
from api.schemas import KeyCreated, KeyList, KeyOut
from jobs.infra import keys
from jobspec.spec import SpecError, SpecProblem

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=201, response_model=KeyCreated, responses=responses(403), summary="Create an API key for an owner (admin)")
def create_key(body: KeyCreate, _: AdminDep, session: SessionDep, settings: SettingsDep) -> KeyCreated:
    if body.owner == ADMIN_OWNER:
        # The admin owner is the TORCHYARD_ADMIN_TOKEN's; a key for it would look like admin but could not manage keys.
        raise HTTPException(422, f"owner: {ADMIN_OWNER!r} is reserved for TORCHYARD_ADMIN_TOKEN")
    unknown = sorted(set(body.queues or []) - set(settings.queues))
    if unknown:
        raise SpecError([SpecProblem(("queues",), f"unknown queue {', '.join(map(repr, unknown))}; "
                                                  f"this service has: {', '.join(settings.queues)}")])
    row, plain = keys.create_key(session, body.owner, body.name, body.queues, max_priority=body.max_priority,
                                  may_protect=body.may_protect)
    return KeyCreated(**KeyOut.of(row).model_dump(), key=plain)


@router.get("", response_model=KeyList, responses=responses(403), summary="List API keys without their secrets (admin)")
def list_keys(_: AdminDep, session: SessionDep) -> KeyList:
    return KeyList(items=[KeyOut.of(k) for k in keys.list_keys(session)])


@router.delete("/{key_id}", status_code=204, response_class=Response, responses=responses(403),
               summary="Revoke an API key (admin); other API processes within TORCHYARD_KEY_CACHE_S")
def revoke_key(key_id: Annotated[str, Path(min_length=1, max_length=32)], _: AdminDep, session: SessionDep,
               request: Request) -> Response:
    keys.revoke_key(session, key_id)
    key_cache(request).forget(key_id)  # at once here; other API processes within TORCHYARD_KEY_CACHE_S
    return Response(status_code=204)
