"""RQ enqueueing. Redis carries work and may be lost; the SQL row stays the truth."""

from __future__ import annotations

import logging
import secrets
from functools import lru_cache

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob

from jobs import gang
from jobs.models import Job

log = logging.getLogger(__name__)

# The job function every worker runs; a dotted path so the API never imports the worker.
SUPERVISE = "worker.supervisor.supervise"
# A multi-node job's nodes other than node 0 (worker/gang.py).
FOLLOW = "worker.gang.follow"
# Results are small and the SQL row is the record; keep Redis lean.
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 86400


@lru_cache(maxsize=8)
def redis_client(url: str) -> Redis:
    return Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=30)


def rq_job_id(job_id: str, attempt: int) -> str:
    return f"{job_id}-a{attempt}"


def current_rq_id(redis: Redis, job: Job) -> str:
    """The RQ id under which the job's current attempt waits: its first offer, or its latest re-offer."""
    offered = redis.get(gang.offer_key(job.id, job.attempt))
    return offered.decode() if offered else rq_job_id(job.id, job.attempt)


def enqueue(redis: Redis, job: Job, rq_id: str | None = None) -> bool:
    """Put one attempt of ``job`` on its queue. False (logged) when Redis is unreachable:
    the job stays queued in SQL and the reconciler enqueues it later."""
    try:
        Queue(job.queue, connection=redis).enqueue(
            SUPERVISE,
            job.id,
            job.attempt,
            job_id=rq_id or rq_job_id(job.id, job.attempt),
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


def reoffer(redis: Redis, job: Job) -> bool:
    """Put a gang job that could not assemble back at the end of its queue. The RQ job that runs now
    already has the attempt's id, so the offer gets a fresh one, remembered for queue_position."""
    rq_id = f"{rq_job_id(job.id, job.attempt)}-o{secrets.token_hex(4)}"
    try:
        redis.set(gang.offer_key(job.id, job.attempt), rq_id, ex=gang.KEY_TTL_S)
    except RedisError:
        return False
    return enqueue(redis, job, rq_id)


def enqueue_follower(redis: Redis, job: Job, nonce: str, node_rank: int) -> str:
    """A task for node ``node_rank`` of the gang round ``nonce``, at the front of the queue so the next
    free worker joins the gang that is assembling (the only one: see jobs.gang.ASSEMBLING_LOCK)."""
    rq_id = f"{rq_job_id(job.id, job.attempt)}-{nonce}-n{node_rank}"
    Queue(job.queue, connection=redis).enqueue(
        FOLLOW, job.id, job.attempt, nonce, node_rank, job_id=rq_id, at_front=True, job_timeout=-1,
        result_ttl=RESULT_TTL_S, failure_ttl=FAILURE_TTL_S,
        description=f"torchyard job {job.id} attempt {job.attempt} node {node_rank}",
    )
    return rq_id


def remove(redis: Redis, queue_name: str, rq_ids: list[str]) -> None:
    """Take tasks that never started off a queue, and delete them; harmless for those already taken."""
    q = Queue(queue_name, connection=redis)
    for rq_id in rq_ids:
        q.remove(rq_id)
        _forget(redis, rq_id)


def _forget(redis: Redis, rq_id: str) -> None:
    """Delete an RQ task that will never run. A removed task's hash has no expiry of its own (RQ sets one
    only once a task finishes), so it would stay in Redis for good."""
    try:
        rq_job = RQJob.fetch(rq_id, connection=redis)
    except NoSuchJobError:
        return
    if rq_job.get_status(refresh=False) in (None, "queued", "deferred", "scheduled", "canceled"):
        rq_job.delete(remove_from_queue=True)


def queue_position(redis: Redis, job: Job) -> int | None:
    """0-based position of the job's current attempt in its RQ queue, or None when not waiting there."""
    try:
        return Queue(job.queue, connection=redis).get_job_position(current_rq_id(redis, job))
    except RedisError:
        return None


def is_waiting(redis: Redis, job: Job) -> bool:
    """Whether the job's current attempt waits in its RQ queue. A job RQ calls "started" is not
    waiting: had its supervisor claimed it, SQL would say running, so that work horse is gone;
    except a gang leader that is assembling its gang before the claim (it says so in Redis)."""
    if redis.exists(gang.held_key(job.id, job.attempt)):
        return True
    try:
        rq_job = RQJob.fetch(current_rq_id(redis, job), connection=redis)
    except NoSuchJobError:
        return False
    if rq_job.get_status(refresh=False) != "queued":
        return False
    return Queue(job.queue, connection=redis).get_job_position(rq_job.id) is not None


def dequeue(redis: Redis, job: Job) -> None:
    """Take a cancelled job's attempt off its queue; harmless if it is not there."""
    try:
        rq_ids = {rq_job_id(job.id, job.attempt), current_rq_id(redis, job)}
        remove(redis, job.queue, sorted(rq_ids))
        redis.delete(gang.offer_key(job.id, job.attempt), gang.held_key(job.id, job.attempt))
    except RedisError as exc:
        log.warning("job %s: could not remove from queue (%s)", job.id, exc, extra={"job_id": job.id})
