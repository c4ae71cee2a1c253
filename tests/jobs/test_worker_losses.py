"""The lost-worker limit as the reconciler applies it to a job whose worker stopped heart-beating: the first
``max_worker_losses`` losses put the job back in line without spending a retry, the next one fails it; a job is
judged on the losses of its earlier attempts, as the supervisor's verdict on a lost node is (jobs.store.states)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from redis import Redis
from sqlmodel import Session

from jobs.lifecycle.reconciler import reconcile
from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Attempt, ErrorType, Job, Status
from jobs.store.states import worker_losses

LONG_AGO = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _running_after_losses(settings: Settings, losses: int) -> str:
    """A job running its attempt ``losses + 1`` on worker w, every earlier attempt lost, its lease expired."""
    with Session(get_engine(settings.database_url), expire_on_commit=False) as s:
        job = Job(owner="admin", name="t", spec={}, status=Status.RUNNING.value, attempt=losses + 1,
                  max_attempts=losses + 1, worker_id="w", lease_expires_at=LONG_AGO)
        s.add(job)
        s.commit()
        for attempt in range(1, losses + 2):
            lost = attempt <= losses
            s.add(Attempt(job_id=job.id, attempt=attempt, worker_id="w", outcome="lost" if lost else None,
                          finished_at=LONG_AGO if lost else None))
        s.commit()
        return job.id


@pytest.mark.parametrize("losses", [0, 1, 2, 3])
def test_the_first_max_worker_losses_losses_are_requeued_without_a_retry_and_the_next_fails(
        settings: Settings, redis_url: str, losses: int) -> None:
    limit = 2
    job_id = _running_after_losses(settings, losses)
    with Session(get_engine(settings.database_url), expire_on_commit=False) as s:
        assert worker_losses(s, job_id, losses + 1) == losses
        report = reconcile(s, Redis.from_url(redis_url), max_worker_losses=limit, retry_s=30)
        job = s.get(Job, job_id, populate_existing=True)
        assert job is not None
        closed = s.get(Attempt, (job_id, losses + 1), populate_existing=True)
        assert closed is not None and closed.outcome == "lost"
    assert job.attempt == losses + 2 and job.worker_id is None and job.error_type == ErrorType.WORKER_LOST.value
    if losses < limit:
        assert report.requeued == [job_id] and job.status == Status.QUEUED.value
        assert job.max_attempts == losses + 2, "a lost worker spent one of the job's retries"
    else:
        assert report.failed == [job_id] and job.status == Status.FAILED.value and job.max_attempts == losses + 1
