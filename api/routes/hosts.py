"""/v1/hosts: the workers' hosts, their GPUs and CPU slots, which job holds each, and their states (drain,
quarantine; jobs/hosts/states.py); /v1/queue: the queued jobs in the order the scheduler considers them, with their
reasons."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request

from api.auth import AdminDep, PrincipalDep
from api.deps import SessionDep, SettingsDep
from api.errors import responses
from api.schemas import DrainIn, HostDetail, HostList, HostOut, QueuedOut, QueueList
from jobs.hosts import registry as hosts
from jobs.hosts import states as host_states
from jobs.scheduling import scheduler

router = APIRouter(tags=["hosts"])


@router.get("/v1/queue", response_model=QueueList,
            summary="Queued jobs in the order the scheduler considers them, each with why it waits (a tenant sees its own)")
def list_queue(principal: PrincipalDep, session: SessionDep) -> QueueList:
    return QueueList(items=[QueuedOut.model_validate(q) for q in scheduler.queued_in_order(session, principal.scope)])


@router.get("/v1/hosts", response_model=HostList, summary="List hosts with their GPUs and CPU slots; another owner's jobs show as busy")
def list_hosts(principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> HostList:
    return HostList(items=[HostOut.model_validate(h) for h in hosts.list_hosts(session, settings.lease_ttl_s, principal.scope)])


def _detail(principal: PrincipalDep, session: SessionDep, settings: SettingsDep, host_id: str) -> HostDetail:
    found = [h for h in hosts.list_hosts(session, settings.lease_ttl_s, principal.scope) if h["id"] == host_id]
    if not found:
        raise HTTPException(404, f"no host {host_id!r} has registered")
    return HostDetail.model_validate({**found[0], "history": host_states.history(session, host_id)})


@router.get("/v1/hosts/{host_id}", response_model=HostDetail, responses=responses(404),
            summary="One host with its state and history (drains, undrains, quarantines, clears)")
def get_host(host_id: str, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> HostDetail:
    return _detail(principal, session, settings, host_id)


def _nudge(request: Request) -> None:
    scheduler.nudge(request.app.state.redis)


@router.post("/v1/hosts/{host_id}/drain", response_model=HostDetail, responses=responses(403, 404),
             summary="Drain a host (admin): nothing new is placed there; its jobs checkpoint and are placed elsewhere")
def drain_host(host_id: str, body: DrainIn, principal: AdminDep, session: SessionDep, settings: SettingsDep,
               request: Request) -> HostDetail:
    if host_states.drain(session, host_id, body.reason, principal.owner) is None:
        raise HTTPException(404, f"no host {host_id!r} has registered")
    _nudge(request)
    return _detail(principal, session, settings, host_id)


@router.post("/v1/hosts/{host_id}/undrain", response_model=HostDetail, responses=responses(403, 404),
             summary="Return a drained host to placement (admin)")
def undrain_host(host_id: str, principal: AdminDep, session: SessionDep, settings: SettingsDep, request: Request) -> HostDetail:
    if host_states.undrain(session, host_id, principal.owner) is None:
        raise HTTPException(404, f"no host {host_id!r} has registered")
    _nudge(request)
    return _detail(principal, session, settings, host_id)


@router.post("/v1/hosts/{host_id}/gpus/{index}/clear", response_model=HostDetail, responses=responses(403, 404),
             summary="Return a quarantined GPU to placement (admin)")
def clear_gpu(host_id: str, index: int, principal: AdminDep, session: SessionDep, settings: SettingsDep,
              request: Request) -> HostDetail:
    if host_states.clear_gpu(session, host_id, index, principal.owner) is None:
        raise HTTPException(404, f"host {host_id!r} has no GPU {index}")
    _nudge(request)
    return _detail(principal, session, settings, host_id)
