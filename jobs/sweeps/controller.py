"""The sweep controller's pass: for every running sweep, read its trials' jobs and metrics from SQL, pause a
trial at its rung, ask the policy (jobs.sweeps.asha) what to promote and stop, create trials up to the sweep's
limits, and finish the sweep with its best trial.

One pass at a time, under the ``sweeps`` lease (jobs/scheduling/leader.py), in a thread beside the scheduler's in every
worker. Each change is a guarded UPDATE of the trial's row (a promotion raises ``allowed_rung`` from the rung it
was decided at; a stop moves ``paused`` to ``stopped``; a trial row is created under its primary key and its job
under an Idempotency-Key of its own), so a pass cut short by a crash is finished by the next one and promotes,
stops or submits nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from redis import Redis
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from jobs.lifecycle import submission
from jobs.scheduling import leader, scheduler, stops
from jobs.scheduling.lease_loop import LeaseLoop
from jobs.settings import Settings
from jobs.store import limits
from jobs.store.models import Job, MetricPoint, Status, Sweep, SweepTrial, utcnow
from jobs.store.states import TransitionRefused, transition
from jobs.sweeps import asha
from jobs.sweeps.sampling import params_of
from jobs.sweeps.spec import SweepSpec, rank_key, trial_spec
from jobs.webhooks import events as webhook_events
from jobspec.spec import spec_from_dict

log = logging.getLogger(__name__)

LEASE = leader.SWEEPS
EARLY_STOPPED = "early_stopped"
ENDED = frozenset({"succeeded", "failed", "cancelled", "stopped"})
_ACTIVE_JOB = (Status.QUEUED.value, Status.RUNNING.value, Status.CANCELLING.value)


@dataclass
class _Trial:
    row: SweepTrial
    job: Any  # (status, last_step, hold, stop_request) of its job, or None before it has one


def _where(trial: SweepTrial) -> list[Any]:
    return [SweepTrial.sweep_id == trial.sweep_id, SweepTrial.number == trial.number]


def _update(session: Session, trial: SweepTrial, guard: list[Any] | None = None, **values: Any) -> bool:
    done = session.exec(sa.update(SweepTrial).where(*_where(trial), *(guard or []))  # type: ignore[call-overload]
                        .values(updated_at=utcnow(), **values)).rowcount == 1
    session.commit()
    for key, value in values.items():
        if done:
            setattr(trial, key, value)
    return done


def _points(session: Session, job_id: str, metric: str) -> list[tuple[int, int | None, float]]:
    rows = session.exec(sa.select(MetricPoint.step, MetricPoint.epoch, MetricPoint.value)  # type: ignore[call-overload]
                        .where(MetricPoint.job_id == job_id, MetricPoint.name == metric).order_by(MetricPoint.step)).all()
    session.commit()
    return [(step, epoch, value) for step, epoch, value in rows]


def rung_values(points: list[tuple[int, int | None, float]], sweep: SweepSpec) -> dict[int, float]:
    """The metric at each rung the points reach: the last value at or before the rung's resource, once a point at or
    past it shows nothing more will be reported before it."""
    if sweep.asha is None or not points:
        return {}
    by_steps = sweep.asha.resource == "steps"
    marked = [(step if by_steps else (epoch + 1 if epoch is not None else None), value) for step, epoch, value in points]
    marked = [(r, v) for r, v in marked if r is not None]
    out: dict[int, float] = {}
    for rung in range(sweep.asha.rungs):
        need = sweep.asha.resource_at(rung)
        if not marked or max(r for r, _ in marked) < need:
            break
        before = [v for r, v in marked if r <= need]
        out[rung] = before[-1] if before else next(v for r, v in marked if r >= need)
    return out


def _refresh(session: Session, sweep: SweepSpec, t: _Trial) -> None:
    """Bring the trial's row up to date with its job: metric values, rungs reached, and an end."""
    row = t.row
    if row.job_id is None or t.job is None or row.state in ENDED:
        return
    points = _points(session, row.job_id, sweep.metric)
    values: dict[str, Any] = {}
    if points:
        values["last_value"] = points[-1][2]
        values["best_value"] = min((p[2] for p in points), key=lambda v: rank_key(sweep.mode, v))
        values["last_step"] = points[-1][0]
    status = t.job[0]
    rungs = rung_values(points, sweep)
    if status != Status.SUCCEEDED.value:
        # A trial that ran past its rung before it paused counts at no rung it was not promoted to: only those
        # let in may be ranked there, or a straggler of rung 0 would take a place at rung 1 it never earned.
        rungs = {k: v for k, v in rungs.items() if k <= row.allowed_rung}
    # Rungs below its bracket's first it only passed through: it is ranked at none of them.
    first = _bracket(sweep, row.number)
    rungs = {k: v for k, v in rungs.items() if k >= first}
    if rungs and {str(k): v for k, v in rungs.items()} != row.rung_values:
        values["rung_values"] = {str(k): v for k, v in rungs.items()}
    if status in (Status.SUCCEEDED.value, Status.FAILED.value):
        values["state"] = status
    elif status == Status.CANCELLED.value:
        values["state"] = "cancelled"
    if values:
        _update(session, row, **values)


def _bracket(sweep: SweepSpec, number: int) -> int:
    """Trial ``number``'s bracket, which is also the first rung it pauses at (0 without ASHA)."""
    return asha.bracket_of(number, sweep.asha.brackets) if sweep.asha is not None else 0


def _of_bracket(sweep: SweepSpec, number: int) -> str:
    """' of bracket s' where a sweep has several: whom the trial is ranked against."""
    several = sweep.asha is not None and sweep.asha.brackets > 1
    return f" of bracket {_bracket(sweep, number)}" if several else ""


def _at_allowed_rung(row: SweepTrial) -> bool:
    """Whether the trial has a value at the highest rung it may train to: due a pause there, or else promoted since."""
    return str(row.allowed_rung) in row.rung_values


def _pause(session: Session, sweep: SweepSpec, name: str, t: _Trial) -> None:
    """A running trial that reached the rung it may train to checkpoints and waits, held, for the policy."""
    row = t.row
    assert sweep.asha is not None
    rung = row.allowed_rung
    if row.state != "running" or rung >= sweep.asha.rungs - 1 or not _at_allowed_rung(row) or t.job is None:
        return
    eta = sweep.asha.reduction_factor
    words = (f"sweep {name}: paused at rung {rung} ({sweep.asha.resource} {sweep.asha.resource_at(rung)}); "
             f"promoted if among the best 1/{eta}{_of_bracket(sweep, row.number)}")
    if t.job[0] == Status.RUNNING.value:
        if not stops.request_stop(session, row.job_id or "", reason=words, hold=words):
            # Another stop is in flight (a preemption): it puts the job back in line; the hold keeps it there.
            stops.hold(session, row.job_id or "", words)
    elif t.job[0] == Status.QUEUED.value:
        stops.hold(session, row.job_id or "", words)
    else:
        return
    _update(session, row, guard=[SweepTrial.state == "running", SweepTrial.allowed_rung == rung], state="paused")
    log.info("sweep %s: trial %d paused at rung %d", row.sweep_id, row.number, rung)


def early_stop(session: Session, job_id: str, reason: str) -> bool:
    """Cancel a trial's job as early-stopped: the transition's reason and the job's error type say so."""
    values = {"error_type": EARLY_STOPPED, "error_message": reason}
    for expect, to in ((Status.QUEUED, Status.CANCELLED), (Status.RUNNING, Status.CANCELLING)):
        try:
            transition(session, job_id, to, expect=[expect], reason=f"{EARLY_STOPPED}: {reason}", values=values)
            return True
        except TransitionRefused:
            continue
    return False


def _decide(session: Session, sweep: SweepSpec, name: str, trials: list[_Trial], free: int) -> int:
    """Promote and stop as the policy says; returns the slots left."""
    assert sweep.asha is not None
    states = [asha.TrialState(t.row.number, {int(k): v for k, v in t.row.rung_values.items()}, t.row.allowed_rung,
                              paused=t.row.state == "paused", ended=t.row.state in ENDED) for t in trials]
    decision = asha.decide(states, eta=sweep.asha.reduction_factor, rungs=sweep.asha.rungs, mode=sweep.mode,
                           all_created=len(trials) >= sweep.trial_count, free_slots=free, brackets=sweep.asha.brackets)
    by_number = {t.row.number: t for t in trials}
    for number, rung in decision.promote:
        t = by_number[number]
        if _update(session, t.row, guard=[SweepTrial.state == "paused", SweepTrial.allowed_rung == rung],
                   state="running", allowed_rung=rung + 1):
            stops.release(session, t.row.job_id or "")
            free -= 1
            log.info("sweep %s: trial %d promoted from rung %d", t.row.sweep_id, number, rung)
    for number in decision.stop:
        t = by_number[number]
        rung = t.row.allowed_rung
        if _update(session, t.row, guard=[SweepTrial.state == "paused"], state="stopped"):
            early_stop(session, t.row.job_id or "", f"sweep {name}: not among the best 1/{sweep.asha.reduction_factor}"
                                                    f"{_of_bracket(sweep, number)} at rung {rung} "
                                                    f"({sweep.asha.resource} {sweep.asha.resource_at(rung)})")
            log.info("sweep %s: trial %d stopped early at rung %d", t.row.sweep_id, number, rung)
    return free


def _repair(session: Session, name: str, t: _Trial) -> None:
    """Finish what a pass cut short, or an attempt undid: a promoted trial whose job is still held, a stopped one
    whose job still runs."""
    if t.job is None or t.row.job_id is None:
        return
    status, _, held, _ = t.job
    # Promoted: let in to a rung it has not reached. Its job may be held because the pass stopped before releasing
    # it, or because its attempt, launched to pause at the old rung, ended there by itself after the release (the
    # pause's verdict holds the job, worker/verdicts.py). Only a sweep's pause holds a job, so either hold is stale.
    promoted = t.row.state == "running" and not _at_allowed_rung(t.row)
    if promoted and held is not None and status == Status.QUEUED.value:
        stops.release(session, t.row.job_id)
        log.info("sweep %s: trial %d released: promoted to rung %d, its job was still held", t.row.sweep_id,
                 t.row.number, t.row.allowed_rung)
    elif t.row.state == "stopped" and status in (Status.QUEUED.value, Status.RUNNING.value):
        early_stop(session, t.row.job_id, f"sweep {name}: stopped early")


def _create(session: Session, redis: Redis, settings: Settings, sweep_row: Sweep, sweep: SweepSpec,
            trials: list[_Trial], free: int) -> None:
    """New trials into the free slots, then jobs for trials that have none yet (a pass cut short)."""
    number = len(trials)
    while free > 0 and number < sweep.trial_count:
        # A trial of a later bracket is let in at its bracket's first rung from the start.
        row = SweepTrial(sweep_id=sweep_row.id, number=number, params=params_of(sweep, number),
                         allowed_rung=_bracket(sweep, number))
        try:
            session.add(row)
            session.commit()
        except IntegrityError:
            session.rollback()  # a leader before us made it; the next pass reads it
            return
        trials.append(_Trial(row, None))
        number += 1
        free -= 1
    for t in trials:
        if t.row.job_id is None and t.row.state == "pending" and not _submit(session, redis, settings, sweep_row, sweep, t.row):
            return


def _submit(session: Session, redis: Redis, settings: Settings, sweep_row: Sweep, sweep: SweepSpec, row: SweepTrial) -> bool:
    raw = trial_spec(sweep, row.params, sweep_row.id, row.number)
    status = session.exec(sa.select(Sweep.status).where(Sweep.id == sweep_row.id)).scalar_one()  # type: ignore[call-overload]
    session.commit()
    if status != "running":  # cancelled since this pass read it: no new job
        return False
    try:
        spec = spec_from_dict(raw)
        sub = submission.submit(session, sweep_row.owner, spec, settings=settings,
                             idempotency_key=f"torchyard-sweep-{sweep_row.id}-trial-{row.number}")
    except limits.OverLimit as exc:
        log.info("sweep %s: trial %d waits: %s", sweep_row.id, row.number, exc)
        return False
    except ValueError as exc:  # the spec no longer validates (a catalog or limit changed since the sweep was made)
        _update(session, row, state="failed")
        log.warning("sweep %s: trial %d cannot run: %s", sweep_row.id, row.number, exc)
        return True
    _update(session, row, job_id=sub.job.id, state="running")
    scheduler.nudge(redis)  # placed now, as a POSTed job is, not at the next timed pass
    log.info("sweep %s: trial %d is job %s", sweep_row.id, row.number, sub.job.id)
    return True


def best(sweep: SweepSpec, rows: list[SweepTrial]) -> SweepTrial | None:
    """The trial that went furthest, best at the furthest rung; without rungs, the best last value of a trial that
    finished (any trial's, while none has)."""
    def key(row: SweepTrial) -> tuple[int, float, int]:
        if row.rung_values:
            top = max(int(k) for k in row.rung_values)
            return (-top, rank_key(sweep.mode, row.rung_values[str(top)]), row.number)
        return (0 if row.state == "succeeded" else 1, rank_key(sweep.mode, row.last_value), row.number)

    scored = [r for r in rows if r.last_value is not None or r.rung_values]
    return min(scored, key=key) if scored else None


def _sweep_pass(session: Session, redis: Redis, settings: Settings, sweep_row: Sweep) -> None:
    sweep = SweepSpec.model_validate(sweep_row.spec)
    rows = session.exec(sa.select(SweepTrial, Job.status, Job.last_step, Job.hold, Job.stop_request)  # type: ignore[call-overload]
                        .outerjoin(Job, Job.id == SweepTrial.job_id)  # type: ignore[arg-type]
                        .where(SweepTrial.sweep_id == sweep_row.id).order_by(SweepTrial.number)).all()
    session.commit()
    trials = [_Trial(r[0], None if r[1] is None else tuple(r[1:])) for r in rows]
    for t in trials:
        _refresh(session, sweep, t)
        _repair(session, sweep_row.name, t)
        if sweep.asha is not None:
            _pause(session, sweep, sweep_row.name, t)
    active = sum(1 for t in trials if t.row.state in ("pending", "running"))
    free = sweep.max_concurrent_trials - active
    if sweep.asha is not None:
        free = _decide(session, sweep, sweep_row.name, trials, free)
    _create(session, redis, settings, sweep_row, sweep, trials, free)
    top = best(sweep, [t.row for t in trials])
    values: dict[str, Any] = {}
    if top is not None and (top.number, top.last_value) != (sweep_row.best_trial, sweep_row.best_value):
        score = top.rung_values[str(max(int(k) for k in top.rung_values))] if top.rung_values else top.last_value
        values.update(best_trial=top.number, best_value=score)
    # Ended when every trial is decided and every trial's job has ended too: a trial stopped early is decided at
    # once, while its job still checkpoints and frees its devices.
    if len(trials) >= sweep.trial_count and all(t.row.state in ENDED and _job_ended(t) for t in trials):
        ok = any(t.row.state == "succeeded" for t in trials)
        values.update(status="succeeded" if ok else "failed", finished_at=utcnow(),
                      message=None if ok else "no trial succeeded")
        log.info("sweep %s %s; best trial %s", sweep_row.id, values["status"], top.number if top else None)
    if values:
        moved = session.exec(sa.update(Sweep).where(Sweep.id == sweep_row.id, Sweep.status == "running")  # type: ignore[call-overload]
                             .values(updated_at=utcnow(), **values)).rowcount == 1
        if moved and "status" in values:
            webhook_events.record_sweep(
                session, sweep_id=sweep_row.id, name=sweep_row.name, owner=sweep_row.owner, status=values["status"],
                message=values.get("message"), best_trial=values.get("best_trial", sweep_row.best_trial),
                best_value=values.get("best_value", sweep_row.best_value))
        session.commit()


def _job_ended(t: _Trial) -> bool:
    return t.job is None or Status(t.job[0]).terminal


def run_pass(session: Session, redis: Redis, settings: Settings) -> int:
    """One pass over every running sweep; returns how many it looked at."""
    sweeps = list(session.exec(sa.select(Sweep).where(Sweep.status == "running").order_by(Sweep.id)).scalars())  # type: ignore[call-overload]
    session.commit()
    for row in sweeps:
        try:
            _sweep_pass(session, redis, settings, row)
        except Exception:  # noqa: BLE001 - one broken sweep must not stall the others
            session.rollback()
            log.exception("sweep %s: pass failed", row.id)
    return len(sweeps)


class SweepLoop(LeaseLoop):
    """Runs in every worker process beside the scheduler: the holder of the ``sweeps`` lease passes every
    ``interval_s``; the others stand by."""

    def __init__(self, settings: Settings, holder: str, redis: Redis, interval_s: float | None = None):
        super().__init__(settings, LEASE, holder, interval_s if interval_s is not None else settings.poll_interval_s,
                         what="sweeps")
        self.redis = redis

    def lead(self, session: Session) -> None:
        run_pass(session, self.redis, self.settings)

