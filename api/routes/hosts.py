"""/v1/hosts: the workers' hosts, their GPUs and CPU slots, and which job holds each; /v1/queue: the queued jobs in
the order the scheduler considers them, with their reasons."""

from __future__ import annotations

from fastapi import APIRouter

from api.auth import PrincipalDep
from api.deps import SessionDep, SettingsDep
from api.schemas import HostList, HostOut, QueuedOut, QueueList
from jobs import hosts, scheduler

router = APIRouter(tags=["hosts"])


@router.get("/v1/queue", response_model=QueueList,
            summary="Queued jobs in the order the scheduler considers them, each with why it waits (a tenant sees its own)")
def list_queue(principal: PrincipalDep, session: SessionDep) -> QueueList:
    owner = None if principal.is_admin else principal.owner
    return QueueList(items=[QueuedOut.model_validate(q) for q in scheduler.queued_in_order(session, owner)])


@router.get("/v1/hosts", response_model=HostList, summary="List hosts with their GPUs and CPU slots; another owner's jobs show as busy")
def list_hosts(principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> HostList:
    viewer = None if principal.is_admin else principal.owner
    return HostList(items=[HostOut.model_validate(h) for h in hosts.list_hosts(session, settings.lease_ttl_s, viewer)])
