"""/v1/jobs: submit, list, inspect, cancel, retry; metrics, checkpoints and weights downloads."""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import StringConstraints

from api import ranges
from api.auth import EVERY_OWNER, PrincipalDep
from api.deps import JobId, RedisDep, SessionDep, SettingsDep
from api.errors import invalid, responses
from api.job_reader import JobReader
from api.request_bodies import JobUpdate
from api.schemas import CheckpointList, CheckpointOut, JobList, JobOut, MetricList, MetricOut
from jobs.code_bundles import files as bundles
from jobs.lifecycle import job_control, submission
from jobs.reads import checkpoint_archive, cursors, job_lookup, job_pages, weights_file
from jobs.scheduling import dependencies, scheduler
from jobs.store.models import Status
from jobspec.spec import LABEL_KEY_PATTERN, NAME_PATTERN, AnySpec, SpecError, SpecProblem, spec_problems

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
    description="Repeat a submission safely: the same key and body return the same job; the same key with "
                "another body answers 422. Scoped to the key's owner.",
)]
SPEC_EXAMPLES = {"mlp": {"summary": "A small MLP on synthetic data, DDP on 2 processes", "value": {
    "name": "mlp-synthetic", "model": {"name": "mlp", "args": {"hidden": 64}},
    "data": {"name": "synthetic-classification", "args": {"samples": 1024}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2}, "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.001},
    "labels": {"team": "vision"},
}}}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_FILE = {**ranges.file_responses("The safetensors file."), **responses(416)}


@router.post("", status_code=201, response_model=JobOut, summary="Submit a job",
             responses={**responses(429), 201: {"headers": {"Idempotent-Replayed": {
                 "description": "'true' when an earlier request with the same Idempotency-Key created this job.",
                 "schema": {"type": "string"}}}}})
def submit_job(
    spec: Annotated[AnySpec, Body(openapi_examples=SPEC_EXAMPLES)],
    principal: PrincipalDep, session: SessionDep, redis: RedisDep, settings: SettingsDep, response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobOut:
    problems = spec_problems(spec, bundles.spec_limits(settings, principal.owner, spec))  # a bundle is its code root
    seen = {p.loc for p in problems}
    problems += [SpecProblem((field,), why) for field, why in principal.spec_problems(spec.queue, spec.priority, spec.preemptible)
                 if (field,) not in seen]
    problems += [SpecProblem(("depends_on",), f"job {job_id} does not exist or is not yours to read")
                 for job_id in dependencies.unreadable(session, principal.owner, spec.depends_on)]
    if problems:
        raise SpecError(problems)
    sub = submission.submit(session, principal.owner, spec, idempotency_key=idempotency_key, settings=settings)
    if sub.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        scheduler.nudge(redis)
    return JobOut.detail(job_lookup.job_detail(session, redis, settings, principal.owner, sub.job.id))


# A label filter: a key as labels have them (jobspec.spec.LABEL_KEY_PATTERN), '=', any value.
LABEL_FILTER = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}="
LabelFilter = Annotated[str, StringConstraints(pattern=LABEL_FILTER, max_length=1024)]


def _labels(label: list[str]) -> dict[str, str]:
    pairs = {}
    for item in label:
        key, sep, value = item.partition("=")
        if not sep or not re.match(LABEL_KEY_PATTERN, key):
            raise invalid("query", "label", f"filter {item!r} must be key=value")
        pairs[key] = value
    return pairs


EVERY_OWNER_OR_NAME = rf"^({re.escape(EVERY_OWNER)}|{NAME_PATTERN.strip('^$')})$"


@router.get("", response_model=JobList, responses=responses(403), summary="List jobs, newest first")
def list_jobs(
    principal: PrincipalDep,
    session: SessionDep,
    status: Annotated[list[Status] | None, Query(description="Repeat to match any of several.")] = None,
    name: Annotated[str | None, Query(max_length=64)] = None,
    label: Annotated[list[LabelFilter], Query(description="key=value; repeat to require several.", max_length=32)] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(pattern=cursors.JOB_CURSOR,
                                        description="A next_cursor this server returned.")] = None,
    owner: Annotated[str | None, Query(pattern=EVERY_OWNER_OR_NAME, description="The admin: this owner's jobs, or * for "
                                       "every owner's (default: the key's own). Another key may name only its own owner.")] = None,
) -> JobList:
    try:
        page = job_pages.list_jobs(session, principal.listed_owner(owner), status=status, name=name, labels=_labels(label),
                                   limit=limit, cursor=cursor)
    except cursors.MalformedCursor as exc:
        raise invalid("query", "cursor", str(exc)) from exc
    return JobList(items=[JobOut.summary(j) for j in page.items], next_cursor=page.next_cursor)


@router.get("/{job_id}", response_model=JobOut,
            summary="One job: status, spec, attempts, transitions, queue position and why it waits, latest metrics, error")
async def get_job(job_id: JobId, principal: PrincipalDep, request: Request) -> Response:
    state = request.app.state
    reader: JobReader = state.job_reader
    rows = await reader.read(job_id)  # in the event loop: cheaper than a hop to a thread (api.job_reader)
    if rows is None or not job_lookup.readable(rows.values["owner"], principal.scope):
        raise job_lookup.JobNotFound(job_id)  # another owner's job is indistinguishable from a missing one
    # A queued job's place and waiting reason are stored by the scheduler: every status reads the same way.
    return _detail_response(job_lookup.detail_of(rows, None, state.redis, state.settings))


def _detail_response(detail: job_lookup.JobDetail) -> Response:
    # Serialised here, once, by pydantic-core: returning the model would validate it again against response_model.
    return Response(JobOut.detail(detail).model_dump_json().encode(), media_type="application/json")


@router.post("/{job_id}/cancel", response_model=JobOut, summary="Cancel a queued or running job", responses=responses(409))
def cancel_job(job_id: JobId, principal: PrincipalDep, session: SessionDep, redis: RedisDep) -> JobOut:
    job = job_control.request_cancel(session, redis, principal.scope, job_id, principal.owner)
    return JobOut.of(job, secrets=job_lookup.secret_names(session, job.id))


@router.delete("/{job_id}", status_code=204, response_class=Response, responses=responses(409),
               summary="Delete a finished job: its rows and its run directory (409 while queued or running)")
def delete_job(job_id: JobId, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> Response:
    job_control.delete_job(session, settings, principal.scope, job_id)
    return Response(status_code=204)


@router.patch("/{job_id}", response_model=JobOut, responses=responses(409),
              summary="Change a queued or running job's priority (up to the key's max_priority)")
def update_job(job_id: JobId, update: JobUpdate, principal: PrincipalDep, session: SessionDep, redis: RedisDep,
               settings: SettingsDep) -> JobOut:
    if why := principal.priority_problem(update.priority):
        raise SpecError([SpecProblem(("priority",), why)])
    job_control.set_priority(session, principal.scope, job_id, update.priority)
    scheduler.nudge(redis)  # a raised priority may place or preempt now, not at the next periodic pass
    return JobOut.detail(job_lookup.job_detail(session, redis, settings, principal.scope, job_id))


@router.post("/{job_id}/retry", status_code=201, response_model=JobOut, responses=responses(409, 429),
             summary="Run a finished job again, from its latest checkpoint, as a new job")
def retry_job(job_id: JobId, principal: PrincipalDep, session: SessionDep, redis: RedisDep, settings: SettingsDep) -> JobOut:
    old = job_lookup.get_job(session, principal.owner, job_id)  # 404 before the cap: another owner's job says nothing
    # The queue may have been removed, or the key narrowed, since the job was submitted.
    why = (None if old.queue in settings.queues else f"queue {old.queue!r} no longer exists; this service has: "
           f"{', '.join(settings.queues)}")
    problems = [SpecProblem(("queue",), why)] if why else []
    problems += [SpecProblem((field,), words) for field, words in principal.spec_problems(old.queue, old.priority, old.preemptible)
                 if not (why and field == "queue")]
    if problems:
        raise SpecError(problems)
    job = submission.retry(session, principal.owner, job_id, settings.max_queued_per_owner)  # a new queued job
    scheduler.nudge(redis)
    return JobOut.detail(job_lookup.job_detail(session, redis, settings, principal.owner, job.id))


@router.get("/{job_id}/metrics", response_model=MetricList, summary="Metric points, ordered by step")
def get_metrics(
    job_id: JobId,
    principal: PrincipalDep,
    session: SessionDep,
    name: Annotated[list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] | None, Query(
        description="Metric names, e.g. train/loss; repeat for several.", max_length=64)] = None,
    since_step: Annotated[int | None, Query(ge=0, le=cursors.SQL_INT_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: Annotated[str | None, Query(pattern=cursors.METRIC_CURSOR,
                                        description="A next_cursor this server returned.")] = None,
) -> MetricList:
    job_lookup.get_job(session, principal.scope, job_id)
    try:
        page = job_pages.metric_points(session, job_id, names=name, since_step=since_step, limit=limit, cursor=cursor)
    except cursors.MalformedCursor as exc:
        raise invalid("query", "cursor", str(exc)) from exc
    return MetricList(items=[MetricOut.of(p) for p in page.items], next_cursor=page.next_cursor)


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, summary="Saved checkpoints with their sizes, oldest first")
def get_checkpoints(job_id: JobId, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> CheckpointList:
    job = job_lookup.get_job(session, principal.scope, job_id)
    return CheckpointList(items=[CheckpointOut.of(info, job.id) for info in job_lookup.checkpoint_infos(session, settings, job)])


def _weights_response(job_id: str, step: int, opened: weights_file.OpenedFile, range_header: str | None) -> StreamingResponse:
    # Served from the descriptor opened under the run directory: the path is never looked up again.
    name = _SAFE_NAME.sub("_", f"{job_id}-step{step}-{opened.name}")
    return ranges.file_response(opened.file, opened.size, name, "application/octet-stream", range_header)


@router.get("/{job_id}/weights", response_class=StreamingResponse, responses=_FILE,
            summary="Download the consolidated weights of the latest checkpoint that has them (the final one)")
def get_final_weights(job_id: JobId, principal: PrincipalDep, session: SessionDep, settings: SettingsDep,
                      range_header: ranges.RangeHeader = None) -> StreamingResponse:
    ckpt, opened = weights_file.weights_file(session, settings, principal.scope, job_id)
    return _weights_response(job_id, ckpt.step, opened, range_header)


@router.get("/{job_id}/checkpoints/{step}/weights", response_class=StreamingResponse, responses=_FILE,
            summary="Download the consolidated weights file of one checkpoint")
def get_checkpoint_weights(
    job_id: JobId, step: Annotated[int, Path(ge=0, le=2**62)], principal: PrincipalDep, session: SessionDep, settings: SettingsDep,
    range_header: ranges.RangeHeader = None,
) -> StreamingResponse:
    ckpt, opened = weights_file.weights_file(session, settings, principal.scope, job_id, step)
    return _weights_response(job_id, ckpt.step, opened, range_header)


@router.get("/{job_id}/checkpoints/{step}/archive", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}}},
            summary="Download a directory checkpoint (Hugging Face checkpoint-N, Accelerate save_state) as a tar archive")
def get_checkpoint_archive(
    job_id: JobId, step: Annotated[int, Path(ge=0, le=2**62)], principal: PrincipalDep, session: SessionDep, settings: SettingsDep,
) -> StreamingResponse:
    ckpt, files = checkpoint_archive.checkpoint_tree(session, settings, principal.scope, job_id, step)
    name = _SAFE_NAME.sub("_", f"{job_id}-step{ckpt.step}-{PurePath(ckpt.path).name}.tar")
    return StreamingResponse(checkpoint_archive.tar_stream(settings, job_id, ckpt, files), media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})
