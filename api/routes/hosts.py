"""/v1/hosts: the workers' hosts, their GPUs and CPU slots, and which job holds each."""

from __future__ import annotations

from fastapi import APIRouter

from api.auth import PrincipalDep
from api.deps import SessionDep, SettingsDep
from api.schemas import HostList, HostOut
from jobs import hosts

router = APIRouter(prefix="/v1/hosts", tags=["hosts"])


@router.get("", response_model=HostList, summary="List hosts with their GPUs and CPU slots; another owner's jobs show as busy")
def list_hosts(principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> HostList:
    viewer = None if principal.is_admin else principal.owner
    return HostList(items=[HostOut.model_validate(h) for h in hosts.list_hosts(session, settings.lease_ttl_s, viewer)])
