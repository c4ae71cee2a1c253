"""Database and Redis calls ride out a blip, but never try again what another try cannot cure, nor past the deadline."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from redis.exceptions import ConnectionError as RedisConnectionError

from jobs.infra import transient


def _flaky(failures: list[Exception]):  # type: ignore[no-untyped-def]
    calls = []

    def fn() -> int:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return len(calls)

    return fn, calls


def test_transient_errors_are_retried_and_rolled_back_between_tries() -> None:
    down = sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
    fn, _ = _flaky([down, RedisConnectionError("reset"), down])
    rollbacks = []
    assert transient.call(fn, deadline=10, what="t", between_tries=lambda: rollbacks.append(1)) == 4
    assert len(rollbacks) == 3


def test_a_bad_statement_fails_at_once() -> None:
    fn, calls = _flaky([sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))])
    with pytest.raises(sa.exc.IntegrityError):
        transient.call(fn, deadline=10, what="t")
    assert len(calls) == 1


def test_the_last_error_is_raised_once_the_deadline_says_so() -> None:
    down = sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
    fn, calls = _flaky([down] * 100)
    tries = iter([False, False, True])
    with pytest.raises(sa.exc.OperationalError):
        transient.call(fn, deadline=lambda: next(tries), what="t")
    assert len(calls) == 3
