"""The Redis connection. Redis carries node tasks to hosts (jobs/scheduling/scheduler.py) and may be lost; SQL stays the truth."""

from __future__ import annotations

from functools import lru_cache

from redis import Redis


@lru_cache(maxsize=8)
def redis_client(url: str) -> Redis:
    return Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, health_check_interval=30)
