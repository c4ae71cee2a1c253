"""/v1/sweeps: create a hyperparameter search, list and inspect sweeps with their trials, cancel one."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response
from pydantic import BaseModel

from api.auth import PrincipalDep
from api.deps import RedisDep, SessionDep, SettingsDep
from api.errors import responses
from api.routes.jobs import IdempotencyKey
from jobs.code_bundles import files as bundles
from jobs.reads import cursors
from jobs.store.models import Sweep, SweepTrial
from jobs.sweeps import asha, store
from jobs.sweeps.spec import SweepSpec
from jobspec.spec import SpecError

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"])

SweepId = Annotated[str, Path(min_length=1, max_length=64, description="Sweep id.")]
EXAMPLES = {"asha": {"summary": "ASHA over the learning rate of a small MLP", "value": {
    "name": "lr-search", "method": "asha", "metric": "eval/loss", "mode": "min", "max_trials": 9,
    "max_concurrent_trials": 3, "asha": {"min_resource": 20, "reduction_factor": 3, "rungs": 3},
    "space": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}},
    "spec": {"name": "mlp", "model": {"name": "mlp", "args": {"hidden": 32}},
             "data": {"name": "synthetic-classification", "args": {"samples": 2048}},
             "parallel": {"nproc_per_node": 1}, "train": {"global_batch_size": 32}},
}}}


class TrialOut(BaseModel):
    number: int
    job_id: str | None
    job_status: str | None
    state: str  # pending | running | paused | stopped | succeeded | failed | cancelled
    params: dict[str, Any]
    rung: int | None  # the highest rung reached
    allowed_rung: int
    bracket: int | None  # asha: its bracket, also the first rung it pauses at; None for grid and random
    rung_values: dict[str, float]
    last_value: float | None
    best_value: float | None
    last_step: int | None

    @classmethod
    def of(cls, row: SweepTrial, job_status: str | None, sweep: SweepSpec) -> TrialOut:
        rung = max((int(k) for k in row.rung_values), default=None)
        bracket = asha.bracket_of(row.number, sweep.asha.brackets) if sweep.asha is not None else None
        return cls(number=row.number, job_id=row.job_id, job_status=job_status, state=row.state, params=row.params,
                   rung=rung, allowed_rung=row.allowed_rung, bracket=bracket, rung_values=row.rung_values,
                   last_value=row.last_value, best_value=row.best_value, last_step=row.last_step)


class SweepOut(BaseModel):
    id: str
    name: str
    owner: str
    status: str  # running | succeeded | failed | cancelled
    method: str
    metric: str
    mode: str
    max_trials: int
    max_concurrent_trials: int
    spec: dict[str, Any]
    created_at: datetime
    finished_at: datetime | None
    message: str | None
    best_trial: int | None
    best_value: float | None
    best_params: dict[str, Any] | None
    trials: list[TrialOut] | None = None  # in the detail only
    counts: dict[str, int] | None = None  # trials by state, in the detail only

    @classmethod
    def of(cls, row: Sweep, trials: list[tuple[SweepTrial, str | None]] | None = None) -> SweepOut:
        sweep = SweepSpec.model_validate(row.spec)
        items = [TrialOut.of(t, status, sweep) for t, status in trials] if trials is not None else None
        best_params = next((t.params for t in items if t.number == row.best_trial), None) if items is not None else None
        counts = None
        if items is not None:
            counts = {}
            for t in items:
                counts[t.state] = counts.get(t.state, 0) + 1
        return cls(id=row.id, name=row.name, owner=row.owner, status=row.status, method=sweep.method, metric=sweep.metric,
                   mode=sweep.mode, max_trials=sweep.trial_count, max_concurrent_trials=sweep.max_concurrent_trials,
                   spec=row.spec, created_at=row.created_at, finished_at=row.finished_at, message=row.message,
                   best_trial=row.best_trial, best_value=row.best_value, best_params=best_params, trials=items, counts=counts)


class SweepList(BaseModel):
    items: list[SweepOut]
    next_cursor: str | None


@router.post("", status_code=201, response_model=SweepOut, responses=responses(429),
             summary="Start a sweep: trials of a base spec over a search space (grid, random or ASHA)")
def create_sweep(sweep: Annotated[SweepSpec, Body(openapi_examples=EXAMPLES)], principal: PrincipalDep,
                 session: SessionDep, settings: SettingsDep, response: Response, idempotency_key: IdempotencyKey = None) -> SweepOut:
    found = store.problems(sweep, lambda spec: bundles.spec_limits(settings, principal.owner, spec),
                           lambda spec: principal.spec_problems(spec.queue, spec.priority, spec.preemptible))
    if found:
        raise SpecError(found)
    row, replayed = store.create(session, principal.owner, sweep, idempotency_key)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return SweepOut.of(row, store.trials(session, row.id))


@router.get("", response_model=SweepList, summary="List sweeps, newest first")
def list_sweeps(principal: PrincipalDep, session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                cursor: Annotated[str | None, Query(pattern=cursors.JOB_CURSOR)] = None) -> SweepList:
    page = store.list_sweeps(session, principal.owner, limit=limit, cursor=cursor)
    return SweepList(items=[SweepOut.of(row) for row in page.items], next_cursor=page.next_cursor)


@router.get("/{sweep_id}", response_model=SweepOut, summary="One sweep: its trials, their parameters, metric, rung and state, "
                                                             "and the best trial so far")
def get_sweep(sweep_id: SweepId, principal: PrincipalDep, session: SessionDep) -> SweepOut:
    row = store.get(session, principal.scope, sweep_id)
    return SweepOut.of(row, store.trials(session, sweep_id))


@router.post("/{sweep_id}/cancel", response_model=SweepOut, responses=responses(409),
             summary="Cancel a sweep: no more trials, and every queued or running trial is cancelled")
def cancel_sweep(sweep_id: SweepId, principal: PrincipalDep, session: SessionDep, redis: RedisDep) -> SweepOut:
    row = store.cancel(session, redis, principal.scope, sweep_id, principal.owner)
    return SweepOut.of(row, store.trials(session, sweep_id))
