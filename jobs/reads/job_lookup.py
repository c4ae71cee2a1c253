"""One job as its owner reads it: the row (another owner's is missing), its detail, attempts, transitions,
checkpoints and secret names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from redis import Redis
from sqlmodel import Session

from jobs.infra import secrets
from jobs.reads import artifacts, job_read
from jobs.settings import Settings
from jobs.store.models import Attempt, Checkpoint, Job, Status, Transition
from jobspec.view import StoredSpec


class JobNotFound(LookupError):
    def __init__(self, job_id: str):
        super().__init__(f"job {job_id} not found")


def get_job(session: Session, owner: str | None, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None or not readable(job.owner, owner):
        # Another owner's job is indistinguishable from a missing one.
        raise JobNotFound(job_id)
    return job


def readable(job_owner: str, scope: str | None) -> bool:
    """A job of ``job_owner`` to a caller whose scope is ``scope``: one owner's jobs, or None for every owner's."""
    return scope is None or job_owner == scope


def secret_names(session: Session, job_id: str) -> list[str]:
    return secrets.names(session, [job_id]).get(job_id, [])


def checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    query = sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
    return list(session.exec(query).scalars())  # type: ignore[call-overload]


def attempts(session: Session, job_id: str) -> list[Attempt]:
    query = sa.select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)
    return list(session.exec(query).scalars())  # type: ignore[call-overload]


def transitions(session: Session, job_id: str) -> list[Transition]:
    query = sa.select(Transition).where(Transition.job_id == job_id).order_by(Transition.id)
    return list(session.exec(query).scalars())  # type: ignore[call-overload]


@dataclass(frozen=True)
class JobDetail:
    job: Job  # a read-only view of the row (attribute access only)
    values: dict[str, Any]  # the job's columns
    queue_position: int | None
    waiting_reason: str | None
    attempts: list[Any]  # Attempt's columns but job_id, as dicts (jobs.reads.job_read)
    transitions: list[Any]  # Transition's columns but id and job_id, as dicts
    nodes_needed: int | None = None  # multi-node jobs while queued: hosts the gang needs at once
    workers_free: int | None = None  # no longer computed: GET /v1/hosts shows what is free
    secret_names: list[str] = field(default_factory=list)


def job_detail(session: Session, redis: Redis, settings: Settings, owner: str | None, job_id: str) -> JobDetail:
    rows = job_read.read(session.connection(), job_id)
    if rows is None or not readable(rows.values["owner"], owner):
        raise JobNotFound(job_id)  # another owner's job is indistinguishable from a missing one
    return detail_of(rows, session, redis, settings)


def detail_of(rows: job_read.JobRows, session: Session | None, redis: Redis, settings: Settings) -> JobDetail:
    """The detail of a job read by ``job_read.read``. A queued job's place and reason are what the scheduler's last
    pass stored with it (jobs/scheduling/scheduler.py), so reading it asks nothing else; ``session`` and ``redis`` are unused."""
    # Read-only attribute access to the row: a Job instance's instrumented construction cost more than the queries.
    job: Any = SimpleNamespace(**rows.values)
    if job.status != Status.QUEUED.value:
        return JobDetail(job, rows.values, None, None, rows.attempts, rows.transitions, secret_names=rows.secret_names)
    nnodes = StoredSpec.of(job.spec).nnodes
    return JobDetail(job, rows.values, job.queue_position, job.waiting_reason, rows.attempts, rows.transitions,
                     nnodes if nnodes > 1 else None, None, rows.secret_names)


@dataclass(frozen=True)
class CheckpointInfo:
    checkpoint: Checkpoint
    path: str  # absolute, as the worker wrote it
    size_bytes: int | None  # None: its files are gone (keep_last) or unreachable from here
    has_weights: bool


def checkpoint_infos(session: Session, settings: Settings, job: Job) -> list[CheckpointInfo]:
    infos = []
    for ckpt in checkpoints(session, job.id):
        local = artifacts.safe_path(settings, job.id, ckpt.path)
        size = artifacts.tree_size(local) if local is not None else None
        path = str(Path(job.run_dir) / ckpt.path) if job.run_dir else ckpt.path
        infos.append(CheckpointInfo(ckpt, path, size, isinstance(ckpt.details.get("weights"), str)))
    return infos
