"""Redis names and read-only views of gang scheduling, shared by the API (waiting_reason) and the
worker (worker/gang.py runs the protocol). See docs/multinode.md.

Gang state is ephemeral: it lives in Redis with expiries and the SQL job row stays the record.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from rq import Queue, Worker

PREFIX = "torchyard:gang"
# Cluster-wide: at most one gang assembles at a time, so two gangs never each hold part of the workers.
ASSEMBLING_LOCK = f"{PREFIX}:assembling"
# Every gang key expires eventually, even when its leader vanished without cleaning up.
KEY_TTL_S = 86400


def nnodes(spec: dict[str, Any]) -> int:
    try:
        return int((spec.get("parallel") or {}).get("nnodes") or 1)
    except (TypeError, ValueError):
        return 1


def round_key(job_id: str, attempt: int, nonce: str) -> str:
    """One assembly round of one attempt; a round that aborted is never reused."""
    return f"{PREFIX}:{job_id}:a{attempt}:{nonce}"


def lock_value(job_id: str, attempt: int, nonce: str) -> str:
    return f"{job_id}:a{attempt}:{nonce}"


def held_key(job_id: str, attempt: int) -> str:
    """Set while a worker holds the job's leader task before the claim: the job is not lost, it is assembling."""
    return f"{PREFIX}:held:{job_id}:a{attempt}"


def offer_key(job_id: str, attempt: int) -> str:
    """The RQ id of the job's latest re-offer (a leader that could not assemble put it back under a new id)."""
    return f"{PREFIX}:offer:{job_id}:a{attempt}"


def assembling(redis: Redis, job_id: str, attempt: int) -> bool:
    value = redis.get(ASSEMBLING_LOCK)
    return value is not None and value.decode().startswith(f"{job_id}:a{attempt}:")


def capacity(redis: Redis, queue_name: str) -> tuple[int, int]:
    """(idle, all) live RQ workers serving ``queue_name``."""
    workers = Worker.all(queue=Queue(queue_name, connection=redis))
    return sum(1 for w in workers if w.get_state() != "busy"), len(workers)
