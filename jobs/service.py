"""Job service functions: everything the API does to jobs goes through here, so routes stay thin."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

import sqlalchemy as sa
from redis import Redis
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from jobs import artifacts, cursors, job_read, limits, secrets
from jobs.models import Attempt, Checkpoint, IdempotencyKey, Job, JobSecret, MetricPoint, Status, Transition, new_job_id, utcnow
from jobs.settings import Settings
from jobs.states import TransitionRefused, transition
from trainer.spec import JobSpec, ScriptJobSpec

log = logging.getLogger(__name__)


class JobNotFound(LookupError):
    def __init__(self, job_id: str):
        super().__init__(f"job {job_id} not found")


class JobConflict(Exception):
    """The request does not fit the job's current status (HTTP 409)."""


class IdempotencyMismatch(ValueError):
    """An ``Idempotency-Key`` reused with a different request (HTTP 422)."""


@dataclass(frozen=True)
class Submission:
    job: Any  # a Job, or a read-only view of the new row's values (attribute access only)
    replayed: bool  # True: an earlier request with the same Idempotency-Key created ``job``


def request_hash(spec: JobSpec | ScriptJobSpec, settings: Settings | None = None) -> str:
    """Digest of the parsed spec, so key order and whitespace in the body do not matter. With secrets it is
    an HMAC under the service's secrets key (jobs.secrets.request_digest): a plain hash of the values
    would let anyone who reads the table test guesses of a secret offline."""
    values = spec.secret_values()
    body = {"spec": spec.visible_dump(), "secrets": values} if values else spec.visible_dump()
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if values:
        if settings is None:
            raise secrets.SecretsUnavailable("a spec with secrets needs the service's settings to be stored")
        return secrets.request_digest(canonical, settings)
    return hashlib.sha256(canonical).hexdigest()


def _idempotent_job(session: Session, owner: str, key: str, digest: str) -> Job | None:
    row = session.get(IdempotencyKey, (owner, key), populate_existing=True)
    if row is None:
        return None
    if not hmac.compare_digest(row.request_hash, digest):
        raise IdempotencyMismatch(f"Idempotency-Key {key!r} was already used with a different request body (job {row.job_id})")
    job = session.get(Job, row.job_id)
    assert job is not None
    return job


_JOB_COLUMNS = list(Job.__table__.columns)  # type: ignore[attr-defined]
_INSERT_JOB = sa.insert(Job.__table__)  # type: ignore[attr-defined]


def submit(
    session: Session, redis: Redis, owner: str, spec: JobSpec | ScriptJobSpec, *,
    idempotency_key: str | None = None, settings: Settings | None = None,
) -> Submission:
    """Record a checked spec as a queued job, then enqueue it. The row commits first:
    if Redis is down the job is still accepted and the reconciler enqueues it.

    With ``idempotency_key`` a repeated request returns the job the first one created; the
    (owner, key) primary key makes concurrent duplicates collide, so exactly one job is made.
    With ``settings`` the owner's queued-job cap applies (limits.OverLimit); a spec with secrets needs
    them (the key that encrypts the secrets, stored in their own table in the same transaction)."""
    digest = request_hash(spec, settings)
    if idempotency_key and (existing := _idempotent_job(session, owner, idempotency_key, digest)):
        return Submission(existing, replayed=True)
    now = utcnow()
    values: dict[str, Any] = {
        "id": new_job_id(), "owner": owner, "name": spec.name, "kind": spec.kind, "status": Status.QUEUED.value,
        "queue": spec.queue, "spec": spec.visible_dump(), "labels": dict(spec.labels), "attempt": 1,
        "max_attempts": spec.retries + 1, "created_at": now, "updated_at": now, "last_seq": 0, "latest_metrics": {},
        "adjustments": [], "priority": spec.priority, "preemptible": spec.preemptible, "borrowed": False,
    }
    try:
        # A Core INSERT of known values: building a Job (SQLModel's validating __init__, whose default factories
        # pydantic inspects on every call), flushing it and reading it back cost a third of a submission's profile.
        session.connection().execute(_INSERT_JOB, values)  # the job row first: the idempotency and secrets rows reference it
        if spec.secrets:
            assert settings is not None  # request_hash refused secrets without settings
            secrets.store(session, values["id"], spec.secret_values(), settings)
        if idempotency_key:
            # A concurrent duplicate collides here on the (owner, key) primary key: IntegrityError below.
            session.add(IdempotencyKey(owner=owner, key=idempotency_key, request_hash=digest, job_id=values["id"]))
            session.flush()
        # Last before the commit: on PostgreSQL the owner's counter row stays locked until the commit, and this
        # is the only thing concurrent submissions of one owner wait on.
        if settings is not None:
            limits.take_queued_slot(session, owner, settings.max_queued_per_owner)
        else:
            limits.move_queued(session, owner, 1)
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = _idempotent_job(session, owner, idempotency_key, digest) if idempotency_key else None
        if existing is None:
            raise
        return Submission(existing, replayed=True)
    except BaseException:
        session.rollback()
        raise
    # Nothing to enqueue: the scheduler reads queued jobs from SQL (jobs/scheduler.py).
    job = SimpleNamespace(**({c.name: None for c in _JOB_COLUMNS} | values))
    log.info("job %s submitted by %s", job.id, owner, extra={"job_id": job.id})
    return Submission(job, replayed=False)


def get_job(session: Session, owner: str, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.owner != owner:
        # Another owner's job is indistinguishable from a missing one.
        raise JobNotFound(job_id)
    return job


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_cursor: str | None


# What a job list needs of each row: every column but the spec and the long error texts, and of the
# spec only what progress bars read. Lists stay bounded however large specs and tracebacks grow.
_SUMMARY_COLUMNS = [c for c in Job.__table__.columns if c.name not in ("spec", "error_traceback", "error_log_tail")]  # type: ignore[attr-defined]
_SPEC_SUMMARY = {
    "parallel": ("parallel",), "train": ("train",), "model_name": ("model", "name"), "data_name": ("data", "name"),
    "data_samples": ("data", "args", "samples"),
}


@dataclass(frozen=True)
class JobSummary:
    """One row of a job list: the job's columns without its spec, and a summary of the spec."""

    values: dict[str, Any]
    spec: dict[str, Any]
    secret_names: list[str]


def _summary_spec(row: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": row.kind}
    for name in ("parallel", "train"):
        if isinstance(getattr(row, f"s_{name}"), dict):
            spec[name] = getattr(row, f"s_{name}")
    if row.s_model_name is not None:
        spec["model"] = {"name": row.s_model_name}
    if row.s_data_name is not None:
        spec["data"] = {"name": row.s_data_name}
        if row.s_data_samples is not None:
            spec["data"]["args"] = {"samples": row.s_data_samples}
    return spec


def list_jobs(
    session: Session, owner: str, *, status: list[Status] | None = None, name: str | None = None,
    labels: dict[str, str] | None = None, limit: int = 50, cursor: str | None = None,
) -> Page:
    """Newest first, as JobSummary items. Ids sort by creation time, so the cursor is the last id seen."""
    spec_parts = [Job.spec[path].label(f"s_{key}") for key, path in _SPEC_SUMMARY.items()]  # type: ignore[index]
    query = sa.select(*_SUMMARY_COLUMNS, *spec_parts).where(Job.owner == owner)
    if status:
        query = query.where(Job.status.in_([s.value for s in status]))  # type: ignore[attr-defined]
    if name:
        query = query.where(Job.name == name)
    if cursor:
        query = query.where(Job.id < cursors.parse_job_cursor(cursor))
    query = query.order_by(Job.id.desc())  # type: ignore[attr-defined]
    if labels:
        # Label filters run in Python: JSON operators differ between SQLite and PostgreSQL.
        matched = []
        for row in session.exec(query):  # type: ignore[call-overload]
            if all(row.labels.get(k) == v for k, v in labels.items()):
                matched.append(row)
                if len(matched) > limit:
                    break
        rows = matched
    else:
        rows = list(session.exec(query.limit(limit + 1)))  # type: ignore[call-overload]
    more = len(rows) > limit
    rows = rows[:limit]
    names = secrets.names(session, [row.id for row in rows])
    items = [JobSummary({c.name: getattr(row, c.name) for c in _SUMMARY_COLUMNS}, _summary_spec(row), names.get(row.id, []))
             for row in rows]
    return Page(items, cursors.job_cursor(rows[-1].id) if more else None)


def secret_names(session: Session, job_id: str) -> list[str]:
    return secrets.names(session, [job_id]).get(job_id, [])


def request_cancel(session: Session, redis: Redis, owner: str, job_id: str) -> Job:
    """Queued: cancelled at once and never runs. Running: ``cancelling``; its supervisor stops
    the whole process tree and finishes the transition. Terminal: JobConflict."""
    job = get_job(session, owner, job_id)
    for _ in range(3):
        status = Status(job.status)
        if status is Status.CANCELLING:
            return job
        if status.terminal:
            raise JobConflict(f"job {job_id} is already {status.value}")
        try:
            if status is Status.QUEUED:
                return transition(session, job_id, Status.CANCELLED, expect=[Status.QUEUED], reason="cancelled by user")
            return transition(session, job_id, Status.CANCELLING, expect=[Status.RUNNING], reason="cancel requested by user")
        except TransitionRefused:
            # It moved on (started, finished) while we looked; decide again on the fresh state.
            job = get_job(session, owner, job_id)
            session.refresh(job)
    raise JobConflict(f"job {job_id} keeps changing state; try again")


def delete_job(session: Session, settings: Settings, owner: str, job_id: str) -> None:
    """Delete a finished job: its rows (metrics, checkpoints, attempts, transitions, secrets, idempotency
    keys, the job) in one transaction, then its run directory. A queued or running job: JobConflict."""
    job = get_job(session, owner, job_id)
    if not Status(job.status).terminal:
        raise JobConflict(f"job {job_id} is {job.status}; cancel it first, only a finished job can be deleted")
    run_dir = Path(job.run_dir) if job.run_dir else None
    for model in (MetricPoint, Checkpoint, Attempt, Transition, JobSecret, IdempotencyKey):
        session.exec(sa.delete(model).where(model.job_id == job_id))  # type: ignore[call-overload, attr-defined]
    # Guarded on the status: a job that is terminal now stays so, but the check and the delete are one statement.
    deleted = session.exec(sa.delete(Job).where(Job.id == job_id, Job.status == job.status))  # type: ignore[call-overload]
    if deleted.rowcount != 1:
        session.rollback()
        raise JobConflict(f"job {job_id} changed while being deleted; try again")
    session.commit()
    if run_dir is not None:
        remove_run_dir(settings, run_dir)


def remove_run_dir(settings: Settings, run_dir: Path) -> None:
    """Remove a job's run directory; only ever one directly under the runs directory."""
    root = settings.runs_dir.resolve()
    target = run_dir.resolve()
    if target.parent != root:
        log.warning("not removing %s: not a run directory under %s", target, root)
        return
    shutil.rmtree(target, ignore_errors=True)


def retry(session: Session, redis: Redis, owner: str, job_id: str, queued_cap: int) -> Job:
    """Run a finished job again as a new job (``retry_of`` names the old one) that starts from the
    old job's latest checkpoint. Terminal states stay final, so history is never rewritten. The new job
    takes a queued slot like a submission (``limits.OverLimit`` at ``queued_cap``)."""
    old = get_job(session, owner, job_id)
    if not Status(old.status).terminal:
        raise JobConflict(f"job {job_id} is {old.status}; only a finished job can be retried")
    saved = checkpoints(session, job_id)
    resume_from = str(Path(old.run_dir) / saved[-1].path) if saved and old.run_dir else None
    job = Job(
        owner=owner, name=old.name, kind=old.kind, queue=old.queue, labels=dict(old.labels), spec=dict(old.spec),
        max_attempts=old.spec.get("retries", 0) + 1, retry_of=old.id, resume_from=resume_from,
        priority=old.priority, preemptible=old.preemptible,
    )
    session.add(job)
    session.flush()
    secrets.copy(session, old.id, job.id)
    limits.take_queued_slot(session, owner, queued_cap)  # last before the commit, as in submit
    session.commit()
    session.refresh(job)
    log.info("job %s retries job %s from %s", job.id, old.id, resume_from or "scratch", extra={"job_id": job.id})
    return job


def metric_points(
    session: Session, job_id: str, *, names: list[str] | None = None, since_step: int | None = None,
    limit: int = 1000, cursor: str | None = None,
) -> Page:
    """Ordered by (step, name); the cursor is the last (step, name) returned."""
    query = sa.select(MetricPoint).where(MetricPoint.job_id == job_id)
    if names:
        query = query.where(MetricPoint.name.in_(names))  # type: ignore[attr-defined]
    if since_step is not None:
        query = query.where(MetricPoint.step >= since_step)
    if cursor:
        step, name = cursors.parse_metric_cursor(cursor)
        # A row-value comparison, so the (job_id, step, name) index serves it as one range (an OR of two does not).
        query = query.where(sa.tuple_(MetricPoint.step, MetricPoint.name) > sa.tuple_(sa.literal(step), sa.literal(name)))
    query = query.order_by(MetricPoint.step, MetricPoint.name).limit(limit + 1)
    rows = list(session.exec(query).scalars())  # type: ignore[call-overload]
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, cursors.metric_cursor(rows[-1].step, rows[-1].name) if more else None)


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
    attempts: list[Any]  # Attempt's columns but job_id, as dicts (jobs.job_read)
    transitions: list[Any]  # Transition's columns but id and job_id, as dicts
    nodes_needed: int | None = None  # multi-node jobs while queued: hosts the gang needs at once
    workers_free: int | None = None  # no longer computed: GET /v1/hosts shows what is free
    secret_names: list[str] = field(default_factory=list)


def job_detail(session: Session, redis: Redis, settings: Settings, owner: str, job_id: str) -> JobDetail:
    rows = job_read.read(session.connection(), job_id)
    if rows is None or rows.values["owner"] != owner:
        raise JobNotFound(job_id)  # another owner's job is indistinguishable from a missing one
    return detail_of(rows, session, redis, settings)


def detail_of(rows: job_read.JobRows, session: Session | None, redis: Redis, settings: Settings) -> JobDetail:
    """The detail of a job read by ``job_read.read``. A queued job's place and reason are what the scheduler's last
    pass stored with it (jobs/scheduler.py), so reading it asks nothing else; ``session`` and ``redis`` are unused."""
    # Read-only attribute access to the row: a Job instance's instrumented construction cost more than the queries.
    job: Any = SimpleNamespace(**rows.values)
    if job.status != Status.QUEUED.value:
        return JobDetail(job, rows.values, None, None, rows.attempts, rows.transitions, secret_names=rows.secret_names)
    nnodes = int((job.spec.get("parallel") or {}).get("nnodes", 1))
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


class FileUnavailable(LookupError):
    """A file the API would serve does not exist here, or lies outside the runs directory (HTTP 404)."""


@dataclass
class OpenedFile:
    """A file the API serves, already open (served from this descriptor, never from its path again)."""

    file: BinaryIO
    size: int
    name: str  # the file's own name, for Content-Disposition


def weights_file(session: Session, settings: Settings, owner: str, job_id: str, step: int | None = None) -> tuple[Checkpoint, OpenedFile]:
    """The consolidated weights of checkpoint ``step``, or of the latest checkpoint that has them, opened."""
    job = get_job(session, owner, job_id)
    saved = [c for c in checkpoints(session, job_id) if step is None or c.step == step]
    if not saved:
        raise FileUnavailable(f"job {job_id} has no checkpoint" + (f" at step {step}" if step is not None else ""))
    with_weights = [c for c in saved if isinstance(c.details.get("weights"), str)]
    if not with_weights and job.spec.get("kind") == "script":
        latest = saved[-1]
        where = str(Path(job.run_dir) / latest.path) if job.run_dir else latest.path
        raise FileUnavailable(
            f"job {job_id} is a script job: its checkpoints hold what its script saved, and torchyard makes no consolidated "
            f"weights file of them; step {latest.step} is {where} on the runs volume (`torchyard status {job_id}` lists "
            f"every checkpoint's path); a file the script writes under artifacts/ downloads with "
            f"`torchyard artifacts {job_id} --get PATH`")
    if not with_weights:
        raise FileUnavailable(f"job {job_id}: no consolidated weights file" + (f" at step {step}" if step is not None else "")
                              + "; the final checkpoint of a finished job has one")
    ckpt = with_weights[-1]
    relative = ckpt.details["weights"]
    try:
        f = artifacts.open_file(settings, job_id, relative)
    except FileNotFoundError:
        log.warning("job %s: weights file %r is missing or not a plain file under the run directory", job_id, relative,
                    extra={"job_id": job_id})
        raise FileUnavailable(f"job {job_id}: the weights file of step {ckpt.step} is not available") from None
    return ckpt, OpenedFile(f, os.fstat(f.fileno()).st_size, Path(relative).name)


def job_log(session: Session, settings: Settings, owner: str, job_id: str, attempt: int | None) -> tuple[Job, int]:
    """The job and the attempt whose logs are wanted (default: the current one)."""
    job = get_job(session, owner, job_id)
    attempt = job.attempt if attempt is None else attempt
    if attempt > job.attempt:
        raise FileUnavailable(f"job {job_id} has no attempt {attempt} (current attempt {job.attempt})")
    return job, attempt


def log_follow_done(session: Session, job_id: str, attempt: int) -> bool:
    """Whether a followed log of ``attempt`` is complete: the job finished or moved on to a later attempt."""
    row = session.exec(sa.select(Job.status, Job.attempt).where(Job.id == job_id)).one()  # type: ignore[call-overload]
    session.commit()  # end the read transaction so the next poll sees new commits
    return Status(row.status).terminal or row.attempt > attempt


# ------------------------------------------------------------------ numbers for /metrics


def status_counts(session: Session) -> dict[str, int]:
    rows = session.exec(sa.select(Job.status, sa.func.count()).group_by(Job.status))  # type: ignore[call-overload]
    counts = {s.value: 0 for s in Status}
    counts.update({status: int(n) for status, n in rows})
    return counts


def events_ingested_total(session: Session) -> int:
    """Events stored from every job's events.jsonl; ``last_seq`` only grows, so the sum is a counter."""
    return int(session.exec(sa.select(sa.func.coalesce(sa.func.sum(Job.last_seq), 0))).scalar_one())  # type: ignore[call-overload]


def dispatches_after(session: Session, after_id: int, limit: int = 5000) -> tuple[list[float], int]:
    """Seconds each job waited from queued to running, for transitions to running after ``after_id``;
    returns the latencies and the id to continue from."""
    started = list(session.exec(  # type: ignore[call-overload]
        sa.select(Transition).where(Transition.id > after_id, Transition.to_status == Status.RUNNING.value)
        .order_by(Transition.id).limit(limit)
    ).scalars())
    if not started:
        return [], after_id
    job_ids = {t.job_id for t in started}
    queued: dict[str, list[Transition]] = {}
    for t in session.exec(  # type: ignore[call-overload]
        sa.select(Transition).where(Transition.job_id.in_(job_ids), Transition.to_status == Status.QUEUED.value)  # type: ignore[attr-defined]
        .order_by(Transition.id)
    ).scalars():
        queued.setdefault(t.job_id, []).append(t)
    created = dict(session.exec(sa.select(Job.id, Job.created_at).where(Job.id.in_(job_ids))).all())  # type: ignore[call-overload, attr-defined]
    latencies = []
    for t in started:
        # The wait began at the job's last return to the queue before this start, else at submission.
        since = max((q.at for q in queued.get(t.job_id, []) if (q.id or 0) < (t.id or 0)), default=created.get(t.job_id))
        if since is not None:
            latencies.append(max(0.0, (t.at - since).total_seconds()))
    return latencies, started[-1].id or after_id


def queue_depths(session: Session) -> dict[str, int]:
    """Queued jobs in each queue, as the scheduler sees them (SQL, not Redis: nothing waits there)."""
    rows = session.exec(sa.select(Job.queue, sa.func.count()).where(Job.status == Status.QUEUED.value)  # type: ignore[call-overload]
                        .group_by(Job.queue)).all()
    return {name: int(n) for name, n in rows}
