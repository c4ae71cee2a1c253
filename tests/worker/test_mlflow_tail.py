"""A script's ``mlflow.log_metric`` calls, with no tracking server, become the job's metrics: the stores the real
MLflow writes (``mlflow.db``, and the file store ``mlruns/``) read back, then only what a later run of the script
added; a series logged without a step numbered by order; other and damaged SQLite files give nothing; a store
swapped for a link to another job's is not read; and the process that parses the job's bytes holds none of the
worker's rights."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.mlflow_tail import MlflowFilesTail, MlflowTail, StepNumbers, file_rows, read_rows

LOG = textwrap.dedent('''
    import sys
    import mlflow
    first, last = int(sys.argv[1]), int(sys.argv[2])
    mlflow.set_experiment("fixture")
    with mlflow.start_run(run_name="r"):
        mlflow.log_param("lr", 0.1)
        for step in range(first, last):
            mlflow.log_metric("train/loss", 1.0 / (step + 1), step=step)
            mlflow.log_metric("seconds", 0.5)  # no step: MLflow stores every one at step 0
        mlflow.log_metric("scale", float("nan"), step=first)
''')


def log_to(workdir: Path, first: int, last: int, file_store: bool = False) -> None:
    """Runs the real MLflow, with no tracking URI (or its file store's, as MLflow 2 and Lightning's MLFlowLogger
    default to), in ``workdir`` as a job's script runs there."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "log.py").write_text(LOG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    if file_store:
        env |= {"MLFLOW_TRACKING_URI": "file:./mlruns", "MLFLOW_ALLOW_FILE_STORE": "true"}
    done = subprocess.run([sys.executable, "log.py", str(first), str(last)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlflow")
    where = tmp_path_factory.mktemp("mlflow") / "workdir"
    log_to(where, 0, 5)
    return where / "mlflow.db"


def series(points: list, name: str) -> list[tuple[int, float]]:
    return [(p.step, p.value) for p in points if p.name == name]


def test_a_scripts_default_store_reads_back_and_then_only_what_was_added(store: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "mlflow.db").write_bytes(store.read_bytes())
    tail = MlflowTail(tmp_path, rescan_s=0.0, read_s=0.0)
    points = tail.read()
    assert series(points, "train/loss") == [(s, 1.0 / (s + 1)) for s in range(5)]
    assert series(points, "seconds") == [(s, 0.5) for s in range(5)]  # numbered by order
    (nan,) = series(points, "scale")
    assert nan[0] == 0 and math.isnan(nan[1])
    assert all(abs(p.time - store.stat().st_mtime) < 600 for p in points)  # MLflow's milliseconds, as seconds
    tail.ack(len(points))
    assert tail.read() == []  # unchanged: not read again

    log_to(workdir, 5, 8)  # the script again, a second run in the same store
    added = tail.read()
    assert series(added, "train/loss") == [(s, 1.0 / (s + 1)) for s in range(5, 8)]
    assert series(added, "seconds") == [(s, 0.5) for s in range(3)]  # the new run's own series, numbered from 0
    assert tail.read() == added  # not acknowledged: offered again
    tail.ack(len(added))
    assert tail.read() == []


def test_a_store_with_more_rows_than_one_read_is_read_in_pages(store: Path) -> None:
    data = store.read_bytes()
    first = read_rows(data, 0, limit=4)
    assert first["mlflow"] and first["more"] and [r[0] for r in first["rows"]] == [1, 2, 3, 4]
    rest = read_rows(data, first["last"], limit=1000)
    assert not rest["more"] and len(first["rows"]) + len(rest["rows"]) == 11  # 5 + 5 + the NaN


def test_other_and_damaged_sqlite_files_give_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    # An application database with a metrics table of its own, not MLflow's.
    with sqlite3.connect(workdir / "app.db") as db:
        db.execute("CREATE TABLE metrics (key TEXT, value REAL)")
        db.execute("INSERT INTO metrics VALUES ('loss', 1.0)")
    db.close()
    (workdir / "half.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(4000))
    (workdir / "notes.db").write_text("not a database")
    tail = MlflowTail(tmp_path, rescan_s=0.0, read_s=0.0)
    assert tail.read() == [] and tail.read(force_scan=True) == []
    assert set(tail.files) == {workdir / "app.db", workdir / "half.sqlite", workdir / "notes.db"}


def test_a_store_swapped_for_a_link_to_another_jobs_is_not_read(store: Path, tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    (mine / "workdir").mkdir(parents=True)
    (other / "workdir").mkdir(parents=True)
    (other / "workdir" / "mlflow.db").write_bytes(store.read_bytes())  # another job's metrics
    planted = mine / "workdir" / "mlflow.db"
    planted.write_bytes(b"")  # found as a plain file first ...
    tail = MlflowTail(mine, rescan_s=0.0, read_s=0.0)
    assert tail.read() == [] and planted in tail.files
    planted.unlink()  # ... then a link to the other job's store in its place, and to its directory above it
    planted.symlink_to(other / "workdir" / "mlflow.db")
    assert tail.read(force_scan=True) == []
    planted.unlink()
    (mine / "workdir").rename(mine / "moved")
    (mine / "workdir").symlink_to(other / "workdir")
    assert tail.read(force_scan=True) == []


def test_the_reader_of_a_jobs_bytes_holds_none_of_the_workers_rights(tmp_path: Path) -> None:
    probe = textwrap.dedent('''
        import os
        from worker.mlflow_read import NOBODY, confine
        confine(0)
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        try:
            open(os.environ.get("PROBE_FILE", "/tmp/probe"), "w").write("x")
            wrote = "yes"
        except OSError as exc:
            wrote = type(exc).__name__
        print(os.getuid(), status["NoNewPrivs"].strip(), status["CapEff"].strip(), wrote, sep=",")
    ''')
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PROBE_FILE": str(tmp_path / "written")})
    assert done.returncode == 0, done.stderr
    uid, no_new_privs, caps, wrote = done.stdout.strip().split(",")
    assert no_new_privs == "1" and int(caps, 16) == 0 and wrote != "yes"
    if os.geteuid() == 0:
        assert int(uid) == 65534
    assert not (tmp_path / "written").exists()


@given(st.lists(st.tuples(st.sampled_from(["r1", "r2"]), st.sampled_from(["loss", "acc"]),
                          st.integers(0, 3)), max_size=60))
def test_series_logged_without_a_step_are_numbered_by_order(rows: list[tuple[str, str, int]]) -> None:
    numbers = StepNumbers()
    got: dict[tuple[str, str], list[int]] = {}
    logged: dict[tuple[str, str], list[int]] = {}
    for run, key, step in rows:
        got.setdefault((run, key), []).append(numbers.step(run, key, step))
        logged.setdefault((run, key), []).append(step)
    for series_id, steps in logged.items():
        first_explicit = next((i for i, s in enumerate(steps) if s != 0), len(steps))
        # Up to its first non-zero step a series is numbered by order; from there on it keeps what it logged.
        assert got[series_id] == list(range(first_explicit)) + steps[first_explicit:]


def test_a_file_store_reads_back_and_then_only_what_was_added(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    workdir = tmp_path / "workdir"
    log_to(workdir, 0, 5, file_store=True)
    tail = MlflowFilesTail(tmp_path, rescan_s=0.0)
    points = tail.read()
    assert series(points, "train/loss") == [(s, 1.0 / (s + 1)) for s in range(5)]  # a name with "/" is a subdirectory
    assert series(points, "seconds") == [(s, 0.5) for s in range(5)]
    (nan,) = series(points, "scale")
    assert nan[0] == 0 and math.isnan(nan[1])
    tail.ack(len(points))
    assert tail.read() == []
    (run,) = [p.parent for p in workdir.glob("mlruns/*/*/meta.yaml")]
    (run / "metrics" / "val" / "metrics").mkdir(parents=True)
    (run / "metrics" / "val" / "metrics" / "acc").write_text("1796650000000 0.5 3\n")  # a name holding "metrics"
    assert [(p.name, p.step, p.value) for p in tail.read()] == [("val/metrics/acc", 3, 0.5)]
    tail.ack(1)
    log_to(workdir, 5, 8, file_store=True)
    added = tail.read()
    assert series(added, "train/loss") == [(s, 1.0 / (s + 1)) for s in range(5, 8)]
    assert series(added, "seconds") == [(s, 0.5) for s in range(3)]


@given(st.lists(st.tuples(st.integers(0, 2**41), st.floats(allow_nan=False), st.integers(0, 2**31 - 1)), max_size=20),
       st.lists(st.integers(0, 2000), max_size=6))
def test_file_store_lines_come_back_whole_and_once_wherever_the_file_is_cut(
        lines: list[tuple[int, float, int]], cuts: list[int]) -> None:
    data = b"".join(f"{stamp} {value!r} {step}\n".encode() for stamp, value, step in lines)
    rows, offset = [], 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:  # the file as it grows
        got, used = file_rows(data[offset:cut] if cut > offset else b"", "run", "loss")
        rows += got
        offset += used
    assert [(r[5], r[3], r[4]) for r in rows] == lines
