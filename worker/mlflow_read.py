"""Reads the metric rows of an MLflow SQLite store, given as bytes on stdin, in a process of its own.

A job's ``mlflow.db`` is the job's input: a file crafted to exploit the SQLite library must not run code with the
worker's rights. So it is opened here, not in the worker: this process first gives up what it can (the uid
``nobody`` where the worker may switch uids, no capabilities, no new privileges, not dumpable, no files to write,
a memory and CPU bound) and is started with an empty environment; it never opens a path, it gets the bytes the
worker read (worker/mlflow_tail.py). It prints one JSON object: ``{"mlflow": false}`` for a database that is not an
MLflow store, else the rows after ``after`` (a rowid) as ``[rowid, run, key, value, step, timestamp_ms, is_nan]``
and ``more`` when ``limit`` cut them short.

Usage: ``python -I -m worker.mlflow_read AFTER LIMIT SIZE`` (standard library and worker/sandbox/drop.py only:
it starts in tens of milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import sqlite3
import sys

from jobspec.pdeathsig import set_not_dumpable, set_parent_death_signal
from worker.sandbox.drop import drop_to, no_new_privs

NOBODY = 65534
CPU_S = 20
HEADER = b"SQLite format 3\x00"
COLUMNS = {"key", "value", "timestamp", "run_uuid", "step", "is_nan"}
MAX_KEY = 250  # MLflow's own key column: a bound on what this process hands back, not which names are stored


def confine(size: int) -> None:
    """Everything this process may give up before it looks at the bytes."""
    set_parent_death_signal(signal.SIGKILL)
    # A worker that cannot switch uids runs its jobs as itself: then this process is no more than they are.
    with contextlib.suppress(PermissionError):
        drop_to(NOBODY, NOBODY)
    no_new_privs()
    set_not_dumpable()
    for limit, value in ((resource.RLIMIT_AS, (512 << 20) + 3 * size), (resource.RLIMIT_CPU, CPU_S),
                         (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_NPROC, 0)):
        resource.setrlimit(limit, (value, value))


def metric_rows(data: bytes, after: int, limit: int) -> dict[str, object]:
    """The rows of the ``metrics`` table after rowid ``after``, or ``{"mlflow": False}`` for another database."""
    if not data.startswith(HEADER) or len(data) < 100:
        return {"mlflow": False}
    image = bytearray(data)
    image[18:20] = b"\x01\x01"  # a WAL database's image read as a rollback one: an in-memory copy has no WAL
    db = sqlite3.connect(":memory:")
    db.deserialize(bytes(image))
    # Only a plain table is read, and nothing the file defines (views, triggers, functions) may run.
    db.execute("PRAGMA trusted_schema=OFF")
    db.execute("PRAGMA query_only=ON")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not {"metrics", "runs", "alembic_version"} <= tables:
        return {"mlflow": False}
    if not {row[1] for row in db.execute("PRAGMA table_info(metrics)")} >= COLUMNS:
        return {"mlflow": False}
    rows, last, more = [], after, False
    query = ("SELECT rowid, run_uuid, key, value, step, timestamp, is_nan FROM metrics WHERE rowid > ? "
             "ORDER BY rowid LIMIT ?")
    for row in db.execute(query, (after, limit + 1)):
        if len(rows) >= limit:
            more = True
            break
        last = row[0]
        rowid, run, key, value, step, stamp, is_nan = row
        numbers = all(isinstance(n, (int, float)) for n in (value, step, stamp, is_nan))
        if numbers and isinstance(key, str) and 0 < len(key) <= MAX_KEY and isinstance(run, str) and len(run) <= MAX_KEY:
            rows.append([rowid, run, key, value, step, stamp, is_nan])
    return {"mlflow": True, "rows": rows, "last": last, "more": more}


def main(argv: list[str]) -> int:
    after, limit, size = (int(a) for a in argv[1:4])
    confine(size)
    data = sys.stdin.buffer.read(size + 1)
    try:
        result = metric_rows(data, after, limit)
    except sqlite3.Error as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
