"""A writer frozen mid-transaction (a worker on a paused VM) must not hold its job's row forever: the reconciler's
requeue of the lapsed lease needs that row. PostgreSQL ends such a session after
``db_idle_in_transaction_timeout_s``, and the blocked writer goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from jobs.settings import get_settings
from jobs.store.db import make_engine

pytestmark = pytest.mark.usefixtures("_idle_limit")

TIMEOUT_S = 2


@pytest.fixture
def _idle_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TORCHYARD_DB_IDLE_IN_TRANSACTION_TIMEOUT_S", str(TIMEOUT_S))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_a_row_lock_held_by_a_frozen_writer_is_released_by_the_server(postgres_url: str) -> None:
    # PostgreSQL only: a SQLite writer frozen mid-transaction holds the file's one write lock, and no server ends it
    # (SQLite serves one host, docs/deploy.md).
    frozen, other = make_engine(postgres_url), make_engine(postgres_url)
    with frozen.begin() as conn:
        conn.execute(sa.text("CREATE TABLE leases (id int primary key, holder text)"))
        conn.execute(sa.text("INSERT INTO leases VALUES (1, 'stale')"))
    stale = frozen.connect()
    stale.begin()
    stale.execute(sa.text("UPDATE leases SET holder = 'stale again' WHERE id = 1"))  # and then it stops
    done = threading.Event()

    def requeue() -> None:
        with other.begin() as conn:
            conn.execute(sa.text("UPDATE leases SET holder = 'fresh' WHERE id = 1"))
        done.set()

    started = time.monotonic()
    threading.Thread(target=requeue, daemon=True).start()
    assert not done.wait(TIMEOUT_S / 2), "the row was not locked: the test shows nothing"
    # Far past the limit: the server must have ended the frozen session by then.
    assert done.wait(60), "the frozen writer still holds the row"
    assert time.monotonic() - started >= TIMEOUT_S * 0.9
    with other.connect() as conn:
        assert conn.execute(sa.text("SELECT holder FROM leases WHERE id = 1")).scalar_one() == "fresh"
    # The frozen writer, on waking, finds its session gone: nothing it wrote counts.
    with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction timeout"):
        stale.execute(sa.text("SELECT 1"))
    stale.invalidate()
    frozen.dispose()
    other.dispose()
