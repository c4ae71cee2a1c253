"""Sweep service functions: check and record a sweep, list and read them, cancel one. Routes stay thin.

A sweep's trials are created by the controller (jobs/sweeps/controller.py), not here: creating a sweep is one
INSERT, so a request never waits on trials and a restart mid-sweep loses nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from redis import Redis
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from jobs.lifecycle import job_control, submission
from jobs.reads import cursors, job_lookup
from jobs.store.models import Job, Status, Sweep, SweepTrial, utcnow
from jobs.store.states import cancelled, canceller
from jobs.sweeps.sampling import params_of
from jobs.sweeps.spec import Choice, IntRange, SweepSpec, set_path, trial_spec
from jobs.webhooks import events as webhook_events
from jobspec.spec import JobSpec, ScriptJobSpec, SpecLimits, SpecProblem, spec_from_dict, spec_problems

log = logging.getLogger(__name__)

SWEEP_LABEL = "torchyard/sweep"
TRIAL_LABEL = "torchyard/trial"
ACTIVE = "running"
ENDED = ("succeeded", "failed", "cancelled")


class SweepNotFound(job_lookup.JobNotFound):
    """A 404, as for jobs (the API answers a missing job and a missing sweep alike)."""

    def __init__(self, sweep_id: str):
        LookupError.__init__(self, f"sweep {sweep_id} not found")


def _samples(sweep: SweepSpec) -> list[tuple[str, Any]]:
    """Each parameter at the values that bound what it can take: every choice, the ends of a range."""
    out: list[tuple[str, Any]] = []
    for path, param in sweep.space.items():
        if isinstance(param, Choice):
            out += [(path, v) for v in param.values]
        elif isinstance(param, IntRange):
            out += [(path, param.low), (path, param.high - (param.high - param.low) % param.step)]
        else:
            out += [(path, param.low), (path, param.high)]
    return out


def _parse(raw: dict[str, Any]) -> tuple[JobSpec | ScriptJobSpec | None, list[SpecProblem]]:
    try:
        return spec_from_dict(raw), []
    except ValidationError as exc:
        return None, [SpecProblem(tuple(e["loc"]), e["msg"]) for e in exc.errors()]


def problems(sweep: SweepSpec, limits_of: Callable[[JobSpec | ScriptJobSpec], SpecLimits],
             key_problems: Callable[[JobSpec | ScriptJobSpec], list[tuple[str, str]]]) -> list[SpecProblem]:
    """What stops some trial of ``sweep`` from running, each naming the field: ``spec.<field>`` for the base spec,
    ``space.<path>`` for a value of the space that makes a spec that cannot run. ``key_problems``: what the caller's
    key may not ask of a spec (queue, priority, protection), as (field, words). Empty: every trial can run."""
    base = trial_spec(sweep, params_of(sweep, 0), "check", 0)
    spec, found = _parse(base)
    if spec is not None:
        found = _checked(spec, limits_of, key_problems)
    out = [_located(sweep, p) for p in found]
    if out:
        return out
    for path, value in _samples(sweep):
        if path.startswith("args.") and base.get("kind") != "script":
            return [SpecProblem(("space", path), "args.<flag> paths need a base spec of kind script")]
        spec, found = _parse(set_path(base, path, value))
        if spec is not None:
            found = _checked(spec, limits_of, key_problems)
        if found:
            return [SpecProblem(("space", path), f"value {value!r}: {p.field}: {p.msg}") for p in found]
    return []


def _checked(spec: JobSpec | ScriptJobSpec, limits_of: Callable[[JobSpec | ScriptJobSpec], SpecLimits],
             key_problems: Callable[[JobSpec | ScriptJobSpec], list[tuple[str, str]]]) -> list[SpecProblem]:
    """As POST /v1/jobs checks a spec: what the host limits refuse, then what the key may not ask."""
    found = spec_problems(spec, limits_of(spec))
    seen = {p.loc for p in found}
    return found + [SpecProblem((field,), why) for field, why in key_problems(spec) if (field,) not in seen]


def _located(sweep: SweepSpec, problem: SpecProblem) -> SpecProblem:
    """A problem of the first trial's spec, named by the space's path when a swept value is what is wrong."""
    for path in sweep.space:
        if problem.field == path or problem.field.startswith(path + ".") or (path.startswith("args.") and problem.loc[:1] == ("args",)):
            return SpecProblem(("space", path), f"{problem.field}: {problem.msg}")
    return SpecProblem(("spec", *problem.loc), problem.msg)


def create(session: Session, owner: str, sweep: SweepSpec, idempotency_key: str | None = None) -> tuple[Sweep, bool]:
    """Record the sweep; returns it and whether an earlier request with the same ``idempotency_key`` made it
    (submission.IdempotencyMismatch when that request had another body)."""
    body = sweep.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    if idempotency_key and (earlier := _by_key(session, owner, idempotency_key, digest)):
        return earlier, True
    row = Sweep(owner=owner, name=sweep.name, spec=body, idempotency_key=idempotency_key, request_hash=digest)
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()  # a concurrent duplicate won
        earlier = _by_key(session, owner, idempotency_key or "", digest)
        if earlier is None:
            raise
        return earlier, True
    session.refresh(row)
    log.info("sweep %s (%s, %d trials) created by %s", row.id, sweep.method, sweep.trial_count, owner)
    return row, False


def _by_key(session: Session, owner: str, key: str, digest: str) -> Sweep | None:
    row = session.exec(sa.select(Sweep).where(Sweep.owner == owner, Sweep.idempotency_key == key)).scalars().first()  # type: ignore[call-overload]
    if row is not None and not hmac.compare_digest(row.request_hash or "", digest):
        raise submission.IdempotencyMismatch(f"Idempotency-Key {key!r} was already used with a different request body (sweep {row.id})")
    return row


def get(session: Session, owner: str | None, sweep_id: str) -> Sweep:
    """``owner``'s sweep (None: any owner's, the admin's reach)."""
    row = session.get(Sweep, sweep_id, populate_existing=True)
    if row is None or not job_lookup.readable(row.owner, owner):
        raise SweepNotFound(sweep_id)  # another owner's sweep is indistinguishable from a missing one
    return row


def trials(session: Session, sweep_id: str) -> list[tuple[SweepTrial, str | None]]:
    """The trials in order, each with its job's status."""
    rows = session.exec(sa.select(SweepTrial, Job.status).outerjoin(Job, Job.id == SweepTrial.job_id)  # type: ignore[call-overload, arg-type]
                        .where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number)).all()
    return [(trial, status) for trial, status in rows]


@dataclass(frozen=True)
class SweepPage:
    items: list[Sweep]
    next_cursor: str | None


def list_sweeps(session: Session, owner: str, *, limit: int = 50, cursor: str | None = None) -> SweepPage:
    query = sa.select(Sweep).where(Sweep.owner == owner)
    if cursor:
        query = query.where(Sweep.id < cursors.parse_job_cursor(cursor))
    rows = list(session.exec(query.order_by(Sweep.id.desc()).limit(limit + 1)).scalars())  # type: ignore[call-overload, attr-defined]
    more = len(rows) > limit
    rows = rows[:limit]
    return SweepPage(rows, cursors.job_cursor(rows[-1].id) if more else None)


def cancel(session: Session, redis: Redis, owner: str | None, sweep_id: str, actor: str) -> Sweep:
    """Stop the sweep: no more trials, and every trial still queued or running is cancelled. The reasons name the
    ``actor`` where it is not the sweep's owner (the admin)."""
    row = get(session, owner, sweep_id)
    message = cancelled(canceller(actor, row.owner))
    if row.status != ACTIVE:
        raise job_control.JobConflict(f"sweep {sweep_id} is already {row.status}")
    done = session.exec(sa.update(Sweep).where(Sweep.id == sweep_id, Sweep.status == ACTIVE).values(  # type: ignore[call-overload]
        status="cancelled", finished_at=utcnow(), updated_at=utcnow(), message=message)).rowcount == 1
    if done:
        webhook_events.record_sweep(session, sweep_id=sweep_id, name=row.name, owner=row.owner, status="cancelled",
                                    message=message, best_trial=row.best_trial, best_value=row.best_value)
    session.commit()
    if not done:
        raise job_control.JobConflict(f"sweep {sweep_id} finished meanwhile")
    for trial, status in trials(session, sweep_id):
        if trial.job_id and status in (Status.QUEUED.value, Status.RUNNING.value):
            with contextlib.suppress(job_control.JobConflict):  # it finished meanwhile
                job_control.request_cancel(session, redis, owner, trial.job_id, actor)
        if trial.state not in ENDED and trial.state != "stopped":
            session.exec(sa.update(SweepTrial).where(SweepTrial.sweep_id == sweep_id, SweepTrial.number == trial.number)  # type: ignore[call-overload]
                         .values(state="cancelled", updated_at=utcnow()))
    session.commit()
    log.info("sweep %s of %s cancelled by %s", sweep_id, row.owner, actor)
    return get(session, owner, sweep_id)
