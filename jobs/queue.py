"""RQ enqueueing. Redis carries work and may be lost; the SQL row stays the truth."""

from __future__ import annotations

import logging
from functools import lru_cache

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob

from jobs.models import Job

log = logging.getLogger(__name__)

# The job function every worker runs; a dotted path so the API never imports the worker.
SUPERVISE = "worker.supervisor.supervise"
# Results are small and the SQL row is the record; keep Redis lean.
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 86400


@lru_cache(maxsize=8)
def redis_client(url: str) -> Redis:
    return Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=30)


def rq_job_id(job_id: str, attempt: int) -> str:
    return f"{job_id}-a{attempt}"


def enqueue(redis: Redis, job: Job) -> bool:
    """Put one attempt of ``job`` on its queue. False (logged) when Redis is unreachable:
    the job stays queued in SQL and the reconciler enqueues it later."""
    try:
        Queue(job.queue, connection=redis).enqueue(
            SUPERVISE,
            job.id,
            job.attempt,
            job_id=rq_job_id(job.id, job.attempt),
            # The supervisor enforces the spec's timeout with a clean stop; RQ's would only kill the work horse.
            job_timeout=-1,
            result_ttl=RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            description=f"torchyard job {job.id} attempt {job.attempt}",
        )
    except RedisError as exc:
        log.warning("job %s: could not enqueue (%s); the reconciler will retry", job.id, exc, extra={"job_id": job.id})
        return False
    return True


def queue_position(redis: Redis, job: Job) -> int | None:
    """0-based position of the job's current attempt in its RQ queue, or None when not waiting there."""
    try:
        return Queue(job.queue, connection=redis).get_job_position(rq_job_id(job.id, job.attempt))
    except RedisError:
        return None


def is_waiting(redis: Redis, job: Job) -> bool:
    """Whether the job's current attempt waits in its RQ queue. A job RQ calls "started" is not
    waiting: had its supervisor claimed it, SQL would say running, so that work horse is gone."""
    try:
        rq_job = RQJob.fetch(rq_job_id(job.id, job.attempt), connection=redis)
    except NoSuchJobError:
        return False
    if rq_job.get_status(refresh=False) != "queued":
        return False
    return Queue(job.queue, connection=redis).get_job_position(rq_job.id) is not None


def dequeue(redis: Redis, job: Job) -> None:
    """Take a cancelled job's attempt off its queue; harmless if it is not there."""
    try:
        Queue(job.queue, connection=redis).remove(rq_job_id(job.id, job.attempt))
    except RedisError as exc:
        log.warning("job %s: could not remove from queue (%s)", job.id, exc, extra={"job_id": job.id})
