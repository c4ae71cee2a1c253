"""/v1/jobs: submit, list, inspect, cancel; metrics and checkpoints."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from api.auth import Principal, current_principal
from api.deps import RedisDep, SessionDep, SettingsDep
from api.schemas import CheckpointList, CheckpointOut, JobList, JobOut, MetricList, MetricOut
from jobs import queue, service
from jobs.models import Status
from trainer.spec import JobSpec, SpecError, spec_problems

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
PrincipalDep = Annotated[Principal, Depends(current_principal)]


def _detail(job, redis) -> JobOut:  # noqa: ANN001
    position = queue.queue_position(redis, job) if job.status == Status.QUEUED.value else None
    return JobOut.of(job, position)


@router.post("", status_code=201, response_model=JobOut, summary="Submit a job")
def submit_job(spec: JobSpec, principal: PrincipalDep, session: SessionDep, redis: RedisDep, settings: SettingsDep) -> JobOut:
    problems = spec_problems(spec, settings.spec_limits())
    if problems:
        raise SpecError(problems)
    job = service.submit(session, redis, principal.owner, spec)
    return _detail(job, redis)


def _labels(label: list[str]) -> dict[str, str]:
    pairs = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HTTPException(422, f"label filter {item!r} must be key=value")
        pairs[key] = value
    return pairs


@router.get("", response_model=JobList, summary="List jobs, newest first")
def list_jobs(
    principal: PrincipalDep,
    session: SessionDep,
    status: Annotated[list[Status] | None, Query(description="Repeat to match any of several.")] = None,
    name: Annotated[str | None, Query(max_length=64)] = None,
    label: Annotated[list[str], Query(description="key=value; repeat to require several.")] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=256)] = None,
) -> JobList:
    try:
        page = service.list_jobs(session, principal.owner, status=status, name=name, labels=_labels(label), limit=limit, cursor=cursor)
    except ValueError as exc:
        raise HTTPException(422, f"cursor: {exc}") from exc
    return JobList(items=[JobOut.of(j) for j in page.items], next_cursor=page.next_cursor)


@router.get("/{job_id}", response_model=JobOut, summary="One job: status, spec, attempts, latest metrics, error")
def get_job(job_id: str, principal: PrincipalDep, session: SessionDep, redis: RedisDep) -> JobOut:
    return _detail(service.get_job(session, principal.owner, job_id), redis)


@router.post("/{job_id}/cancel", response_model=JobOut, summary="Cancel a queued or running job")
def cancel_job(job_id: str, principal: PrincipalDep, session: SessionDep, redis: RedisDep) -> JobOut:
    return JobOut.of(service.request_cancel(session, redis, principal.owner, job_id))


@router.post("/{job_id}/retry", status_code=201, response_model=JobOut,
             summary="Run a finished job again, from its latest checkpoint, as a new job")
def retry_job(job_id: str, principal: PrincipalDep, session: SessionDep, redis: RedisDep) -> JobOut:
    return _detail(service.retry(session, redis, principal.owner, job_id), redis)


@router.get("/{job_id}/metrics", response_model=MetricList, summary="Metric points, ordered by step")
def get_metrics(
    job_id: str,
    principal: PrincipalDep,
    session: SessionDep,
    name: Annotated[list[str] | None, Query(description="Metric names, e.g. train/loss; repeat for several.")] = None,
    since_step: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Annotated[str | None, Query(max_length=256)] = None,
) -> MetricList:
    service.get_job(session, principal.owner, job_id)
    try:
        page = service.metric_points(session, job_id, names=name, since_step=since_step, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise HTTPException(422, f"cursor: {exc}") from exc
    return MetricList(items=[MetricOut.of(p) for p in page.items], next_cursor=page.next_cursor)


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, summary="Saved checkpoints, oldest first")
def get_checkpoints(job_id: str, principal: PrincipalDep, session: SessionDep) -> CheckpointList:
    job = service.get_job(session, principal.owner, job_id)
    return CheckpointList(items=[CheckpointOut.of(c, job.run_dir) for c in service.checkpoints(session, job_id)])
