"""An attempt as the executor names it (its ``executor_id``, a Slurm job id): recorded where an operator finds it,
and an earlier attempt still running there stopped before a new one writes the same run directory."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.models import Attempt, Job
from worker.executors.base import Executor, LaunchError, LaunchRequest

log = logging.getLogger(__name__)


def record_executor_id(session: Session, job: Job, executor_id: str | None) -> None:
    """The executor's name of the attempt (the Slurm job id), in the job and the attempt as soon as it exists:
    an operator finds it in squeue, and a later attempt stops it if this worker vanishes."""
    if executor_id is None:
        return
    session.exec(sa.update(Job).where(Job.id == job.id, Job.attempt == job.attempt)  # type: ignore[call-overload]
                 .values(executor_id=executor_id))
    row = session.get(Attempt, (job.id, job.attempt))
    if row is not None:
        row.executor_id = executor_id
        session.add(row)
    session.commit()


def stop_earlier(session: Session, executor: Executor, request: LaunchRequest, grace_s: float,
                 on_wait: Callable[[], object]) -> None:
    """An earlier attempt whose worker vanished may still run in the engine (a Slurm job outlives the worker
    that submitted it); two attempts must never write one run directory. It gets the grace to checkpoint."""
    job_id, attempt = request.job_id, request.attempt
    extra = {"job_id": job_id}
    rows = session.exec(sa.select(Attempt).where(  # type: ignore[call-overload]
        Attempt.job_id == job_id, Attempt.attempt < attempt, Attempt.executor_id.is_not(None))).scalars().all()  # type: ignore[union-attr]
    session.commit()
    for row in rows:
        try:
            earlier = executor.attach(dataclasses.replace(request, attempt=row.attempt), row.executor_id)
            if executor.poll(earlier).ended:
                continue
        except LaunchError as exc:
            log.warning("job %s: attempt %d (%s) cannot be checked: %s", job_id, row.attempt, row.executor_id, exc,
                        extra=extra)
            continue
        log.warning("job %s: attempt %d (%s) still runs; stopping it", job_id, row.attempt, row.executor_id, extra=extra)
        executor.stop(earlier, grace_s, on_wait=on_wait)
