"""Database and Redis calls tried again through a blip (a restart, a failover, a dropped connection).

Only errors another try can cure are tried again: a lost or refused connection, a timeout, SQLite's lock
contention. A constraint violation or a bad statement fails at once. The deadline is the caller's:
the supervisor gives the time its lease has left, so it never retries past the point where the
reconciler may hand the job to someone else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential_jitter

log = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_SQL = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError, sa.exc.PendingRollbackError)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the database or Redis was unreachable for a moment (worth trying again)."""
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return True
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, _TRANSIENT_SQL)


def call(fn: Callable[[], T], *, deadline: float | Callable[[], bool], what: str,
         between_tries: Callable[[], None] | None = None) -> T:
    """``fn()``, tried again on transient errors until ``deadline`` (seconds from now, or a predicate that says
    the time is up: a lease that may lapse); then the last error is raised.

    ``between_tries`` runs before each new try (a session's rollback: its connection may be dead)."""
    if callable(deadline):
        out_of_time = deadline
    else:
        until = time.monotonic() + deadline
        out_of_time = lambda: time.monotonic() >= until  # noqa: E731

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s failed (%s: %s); trying again (try %d)", what, type(exc).__name__, str(exc).splitlines()[0] if exc else "",
                    state.attempt_number)
        if between_tries is not None:
            try:
                between_tries()
            except Exception:  # noqa: BLE001 - a rollback on a dead connection may fail too; the next try reconnects
                log.debug("cleanup before trying %s again failed", what, exc_info=True)

    retrying = Retrying(
        retry=retry_if_exception(is_transient), stop=lambda _state: out_of_time(),
        wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.1), reraise=True, before_sleep=before_sleep,
    )
    return retrying(fn)
