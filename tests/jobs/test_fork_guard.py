"""A task forked while another thread of the worker writes to SQLite can still write (jobs/infra/fork_guard.py)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobs.infra import fork_guard
from jobs.infra.fork_guard import GUARD
from jobs.store import db
from jobs.store.db import make_engine

WRITE_HELD_S = 1.0


def _fork_while_a_thread_writes(tmp_path: Path, guarded: bool) -> tuple[str, float]:
    """Fork while another thread holds the write lock for WRITE_HELD_S; the child then writes with a 3 s busy
    timeout. Returns the child's outcome and how long after the writer committed the fork happened."""
    db = tmp_path / "jobs.store.db"
    engine = make_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
    holding, committed = threading.Event(), []

    def writer() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
            holding.set()
            time.sleep(WRITE_HELD_S)
        committed.append(time.monotonic())

    thread = threading.Thread(target=writer)
    thread.start()
    holding.wait()
    read, write = os.pipe()
    if guarded:
        with GUARD.quiet():
            pid = os.fork()
    else:
        pid = os.fork()
    if pid == 0:  # the task: new connections of its own, as worker/supervisor.py opens them
        try:
            engine.dispose(close=False)
            conn = sqlite3.connect(db, timeout=3)
            conn.execute("INSERT INTO t VALUES (2)")
            conn.commit()
            os.write(write, b"wrote")
        except sqlite3.OperationalError as exc:
            os.write(write, str(exc).encode())
        finally:
            os._exit(0)
    forked = time.monotonic()
    os.close(write)
    os.waitpid(pid, 0)
    thread.join()
    outcome = os.read(read, 200).decode()
    os.close(read)
    engine.dispose()
    return outcome, forked - committed[0]


def test_a_fork_waits_for_the_write_in_flight_and_the_child_writes(tmp_path: Path) -> None:
    outcome, after_commit = _fork_while_a_thread_writes(tmp_path, guarded=True)
    assert outcome == "wrote"
    assert after_commit >= 0  # the fork waited for the writer's commit


def test_without_the_guard_the_child_inherits_the_lock_and_cannot_write(tmp_path: Path) -> None:
    # What the guard is for: SQLite's lock record crosses the fork, and the child waits out its busy timeout.
    outcome, _ = _fork_while_a_thread_writes(tmp_path, guarded=False)
    assert outcome == "database is locked"


def test_a_fork_waits_for_a_connection_being_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a connection (the file, then the pragmas, which take locks) counts as SQLite in use: a fork asked for
    meanwhile happens once it is open."""
    monkeypatch.setattr(fork_guard, "QUIET_WAIT_S", 300.0)  # a deadline, not a wait: the order is what is checked
    engine = make_engine(f"sqlite:///{tmp_path / 'opening.db'}")
    inside, go, order = threading.Event(), threading.Event(), []
    opened = db.sqlite_connect

    def slow_open(url: str) -> sqlite3.Connection:
        inside.set()
        go.wait(300)
        conn = opened(url)
        order.append("opened")
        return conn

    monkeypatch.setattr(db, "sqlite_connect", slow_open)
    opener = threading.Thread(target=lambda: engine.connect().close())
    opener.start()
    assert inside.wait(300)
    threading.Timer(0.3, go.set).start()
    with GUARD.quiet():
        order.append("fork")
    opener.join()
    engine.dispose()
    assert order == ["opened", "fork"]
