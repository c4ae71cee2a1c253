"""New jobs: a submission (with its Idempotency-Key) and a retry of a finished job. Both insert the row through
``_create``, so a new job's defaults, its secrets, the owner's queued counter and cap are the same either way."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from jobs.infra import secrets
from jobs.lifecycle.job_control import JobConflict
from jobs.reads.job_lookup import checkpoints, get_job
from jobs.settings import Settings
from jobs.store import limits
from jobs.store.models import IdempotencyKey, Job, Status, new_job_id, utcnow
from jobspec.spec import JobSpec, ScriptJobSpec

log = logging.getLogger(__name__)


class IdempotencyMismatch(ValueError):
    """An ``Idempotency-Key`` reused with a different request."""


@dataclass(frozen=True)
class Submission:
    job: Any  # a read-only view of the new row's values (attribute access only), or the Job a replay found
    replayed: bool  # True: an earlier request with the same Idempotency-Key created ``job``


def request_hash(spec: JobSpec | ScriptJobSpec, settings: Settings | None = None) -> str:
    """Digest of the parsed spec, so key order and whitespace in the body do not matter. With secrets it is
    an HMAC under the service's secrets key (jobs.infra.secrets.request_digest): a plain hash of the values
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


@dataclass(frozen=True)
class _Idempotency:
    key: str
    digest: str


def _create(
    session: Session, owner: str, *, name: str, kind: str, queue: str, spec: dict[str, Any], labels: dict[str, str],
    max_attempts: int, priority: int, preemptible: bool, queued_cap: int | None,
    add_secrets: Callable[[str], None] | None = None, idempotency: _Idempotency | None = None,
    retry_of: str | None = None, resume_from: str | None = None,
) -> Any:
    """Insert a queued job and commit it with its secrets (``add_secrets(job_id)``), its Idempotency-Key and the
    owner's queued counter; ``queued_cap`` None counts without a cap. Returns a read-only view of the new row.
    Rolls back on any error; an IntegrityError here is a concurrent duplicate of ``idempotency`` (or a defect)."""
    now = utcnow()
    values: dict[str, Any] = {
        "id": new_job_id(), "owner": owner, "name": name, "kind": kind, "status": Status.QUEUED.value,
        "queue": queue, "spec": spec, "labels": labels, "attempt": 1, "max_attempts": max_attempts,
        "retry_of": retry_of, "resume_from": resume_from, "created_at": now, "updated_at": now, "last_seq": 0,
        "latest_metrics": {}, "adjustments": [], "priority": priority, "preemptible": preemptible, "borrowed": False,
    }
    try:
        # A Core INSERT of known values: building a Job (SQLModel's validating __init__, whose default factories
        # pydantic inspects on every call), flushing it and reading it back cost a third of a submission's profile.
        session.connection().execute(_INSERT_JOB, values)  # the job row first: the idempotency and secrets rows reference it
        if add_secrets is not None:
            add_secrets(values["id"])
        if idempotency is not None:
            # A concurrent duplicate collides here on the (owner, key) primary key: IntegrityError.
            session.add(IdempotencyKey(owner=owner, key=idempotency.key, request_hash=idempotency.digest, job_id=values["id"]))
        session.flush()
        # Last before the commit: on PostgreSQL the owner's counter row stays locked until the commit, and this
        # is the only thing concurrent submissions of one owner wait on.
        if queued_cap is not None:
            limits.take_queued_slot(session, owner, queued_cap)
        else:
            limits.move_queued(session, owner, 1)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    # The values just inserted, every other column None (as the table has them): reading the row back through
    # the ORM was part of the cost above, and callers only read attributes of the new job.
    return SimpleNamespace(**({c.name: None for c in _JOB_COLUMNS} | values))


def submit(
    session: Session, owner: str, spec: JobSpec | ScriptJobSpec, *,
    idempotency_key: str | None = None, settings: Settings | None = None,
) -> Submission:
    """Record a checked spec as a queued job. Nothing is enqueued: the scheduler reads queued jobs from SQL
    (jobs/scheduling/scheduler.py); the API nudges it after a new job.

    With ``idempotency_key`` a repeated request returns the job the first one created; the
    (owner, key) primary key makes concurrent duplicates collide, so exactly one job is made.
    With ``settings`` the owner's queued-job cap applies (limits.OverLimit); a spec with secrets needs
    them (the key that encrypts the secrets, stored in their own table in the same transaction)."""
    digest = request_hash(spec, settings)
    if idempotency_key and (existing := _idempotent_job(session, owner, idempotency_key, digest)):
        return Submission(existing, replayed=True)
    add_secrets = None
    if spec.secrets:
        assert settings is not None  # request_hash refused secrets without settings
        add_secrets = partial(secrets.store, session, values=spec.secret_values(), settings=settings)
    try:
        job = _create(
            session, owner, name=spec.name, kind=spec.kind, queue=spec.queue, spec=spec.visible_dump(), labels=dict(spec.labels),
            max_attempts=spec.retries + 1, priority=spec.priority, preemptible=spec.preemptible,
            queued_cap=settings.max_queued_per_owner if settings is not None else None, add_secrets=add_secrets,
            idempotency=_Idempotency(idempotency_key, digest) if idempotency_key else None,
        )
    except IntegrityError:
        existing = _idempotent_job(session, owner, idempotency_key, digest) if idempotency_key else None
        if existing is None:
            raise
        return Submission(existing, replayed=True)
    log.info("job %s submitted by %s", job.id, owner, extra={"job_id": job.id})
    return Submission(job, replayed=False)


def retry(session: Session, owner: str, job_id: str, queued_cap: int) -> Any:
    """Run a finished job again as a new job (``retry_of`` names the old one) that starts from the
    old job's latest checkpoint, with its spec and secrets. Terminal states stay final, so history is never
    rewritten. The new job takes a queued slot like a submission (``limits.OverLimit`` at ``queued_cap``).
    Returns a read-only view of the new row, as ``submit`` does."""
    old = get_job(session, owner, job_id)
    if not Status(old.status).terminal:
        raise JobConflict(f"job {job_id} is {old.status}; only a finished job can be retried")
    saved = checkpoints(session, job_id)
    resume_from = str(Path(old.run_dir) / saved[-1].path) if saved and old.run_dir else None
    job = _create(
        session, owner, name=old.name, kind=old.kind, queue=old.queue, spec=dict(old.spec), labels=dict(old.labels),
        max_attempts=old.spec.get("retries", 0) + 1, priority=old.priority, preemptible=old.preemptible,
        queued_cap=queued_cap, add_secrets=partial(secrets.copy, session, job_id),
        retry_of=old.id, resume_from=resume_from,
    )
    log.info("job %s retries job %s from %s", job.id, job_id, resume_from or "scratch", extra={"job_id": job.id})
    return job
