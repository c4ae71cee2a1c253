"""/v1/quotas: each owner's guaranteed GPUs and CPU slots, set by the admin, with what the owner holds now."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Response

from api.auth import ADMIN_OWNER, AdminDep, PrincipalDep
from api.deps import SessionDep
from api.errors import responses
from api.request_bodies import QuotaIn
from api.schemas import QuotaList, QuotaOut
from jobs.scheduling import quotas
from jobspec.spec import NAME_PATTERN

router = APIRouter(prefix="/v1/quotas", tags=["quotas"])
Owner = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64, description="The owner (tenant) the quota is for.")]


@router.get("", response_model=QuotaList, summary="Quotas and what each owner holds now (a tenant sees its own)")
def list_quotas(principal: PrincipalDep, session: SessionDep) -> QuotaList:
    return QuotaList(items=[QuotaOut.model_validate(u, from_attributes=True) for u in quotas.usage(session, principal.scope)])


@router.put("/{owner}", response_model=QuotaOut, responses=responses(403),
            summary="Set an owner's guaranteed GPUs and CPU slots (admin); null: no limit on that resource")
def put_quota(owner: Owner, body: QuotaIn, _: AdminDep, session: SessionDep) -> QuotaOut:
    if owner == ADMIN_OWNER:
        raise HTTPException(422, f"owner: {ADMIN_OWNER!r} is the admin token's and has no quota")
    quotas.set_quota(session, owner, body.gpus, body.cpu_slots)
    return QuotaOut.model_validate(quotas.usage(session, owner)[0], from_attributes=True)


@router.delete("/{owner}", status_code=204, response_class=Response, responses=responses(403, 404),
               summary="Remove an owner's quota (admin): no limit, and nothing guaranteed")
def delete_quota(owner: Owner, _: AdminDep, session: SessionDep) -> Response:
    if not quotas.delete_quota(session, owner):
        raise HTTPException(404, f"owner {owner} has no quota")
    return Response(status_code=204)
