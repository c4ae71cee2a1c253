"""A worker running jobs as its own user ends what ended attempts left running, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine, init_db
from jobs.store.models import Attempt, Job, Status, utcnow
from jobspec.pdeathsig import parent_gone
from tests.conftest import make_settings
from tests.helpers import wait_until
from worker.sandbox.leftovers import Marked, end_leftovers, to_end

RUNS = "/srv/torchyard/runs"
UID = 1000

marked = st.builds(
    Marked,
    pid=st.integers(2, 60),
    uid=st.sampled_from([UID, UID + 1]),
    job_id=st.sampled_from([None, "", "a", "b"]),
    attempt=st.sampled_from([None, "", "1", "2"]),
    run_dir=st.sampled_from([None, f"{RUNS}/a", f"{RUNS}/b/workdir", "/elsewhere/runs/a", RUNS, "/srv/torchyard/runs-other/a"]),
)
held_sets = st.sets(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 2)))


def _kept_by_rule(p: Marked, held: set[tuple[str, int]]) -> bool:
    return (p.uid != UID or not p.job_id or not p.attempt or p.run_dir is None
            or not p.run_dir.startswith(RUNS + "/") or (p.job_id, int(p.attempt)) in held)


@given(st.lists(marked, max_size=12, unique_by=lambda p: p.pid), held_sets, st.sets(st.integers(2, 60), max_size=3))
def test_only_marked_processes_of_unheld_attempts_of_this_user_and_deployment_end(
        procs: list[Marked], held: set[tuple[str, int]], spare: set[int]) -> None:
    ended = set(to_end(procs, held, UID, RUNS, spare))
    for p in procs:
        assert (p.pid in ended) == (not _kept_by_rule(p, held) and p.pid not in spare), p


@given(st.lists(marked, max_size=12, unique_by=lambda p: p.pid), held_sets, held_sets)
def test_holding_more_attempts_never_ends_more(procs: list[Marked], held: set[tuple[str, int]],
                                               more: set[tuple[str, int]]) -> None:
    assert set(to_end(procs, held | more, UID, RUNS, set())) <= set(to_end(procs, held, UID, RUNS, set()))


@given(st.lists(marked, max_size=12, unique_by=lambda p: p.pid))
def test_every_attempt_held_ends_nothing(procs: list[Marked]) -> None:
    everything = {(j, a) for j in ("a", "b") for a in (1, 2)}
    assert to_end(procs, everything, UID, RUNS, set()) == []


marks = st.fixed_dictionaries({}, optional={"TORCHYARD_JOB_ID": st.sampled_from(["j1", "j2"]),
                                            "TORCHYARD_ATTEMPT": st.sampled_from(["1", "2"])})


@given(marks, st.integers(1, 5000), st.one_of(st.none(), st.binary(max_size=40)))
def test_a_process_without_both_marks_is_never_judged_orphaned(env: dict[str, str], ppid: int,
                                                               parent: bytes | None) -> None:
    if len(env) < 2:
        assert not parent_gone(ppid, env, parent)


@given(st.sampled_from(["j1", "j2"]), st.sampled_from(["1", "2"]), st.integers(1, 5000),
       st.lists(st.sampled_from([b"PATH=/bin", b"TORCHYARD_JOB_ID=j1", b"TORCHYARD_ATTEMPT=2", b"X=1"]), max_size=4))
def test_a_rank_is_orphaned_unless_its_parent_carries_its_attempt(job: str, attempt: str, ppid: int,
                                                                 others: list[bytes]) -> None:
    env = {"TORCHYARD_JOB_ID": job, "TORCHYARD_ATTEMPT": attempt}
    own = [f"TORCHYARD_JOB_ID={job}".encode(), f"TORCHYARD_ATTEMPT={attempt}".encode()]
    assert not parent_gone(ppid, env, b"\0".join([*others, *own]))
    has_both = set(own) <= set(others)
    assert parent_gone(ppid, env, b"\0".join(others)) == (not has_both)
    # The parent's environment unreadable: only init as the parent says the launcher is gone.
    assert parent_gone(ppid, env, None) == (ppid == 1)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    s = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", "redis://unused")
    init_db(get_engine(s.database_url))
    return s


@pytest.fixture
def planted() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _plant(procs: list[subprocess.Popen[bytes]], **env: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, **env})
    procs.append(proc)
    return proc


def _job(session: Session, job_id: str, attempt: int, lease_s: float) -> None:
    session.add(Job(id=job_id, owner="alice", name=job_id, spec={}, status=Status.RUNNING.value, attempt=attempt,
                    worker_id="w", lease_expires_at=utcnow() + timedelta(seconds=lease_s)))
    session.commit()


def test_a_starting_worker_ends_the_processes_of_ended_attempts_only(settings: Settings,
                                                                     planted: list[subprocess.Popen[bytes]]) -> None:
    runs = os.path.realpath(settings.runs_dir)
    with Session(get_engine(settings.database_url)) as session:
        _job(session, "live", 2, lease_s=600)  # its supervisor runs on: the worker's own process alone died
        _job(session, "lapsed", 1, lease_s=-60)  # its supervisor died with its worker
        # A Slurm job's ranks outlive their worker too, but the next attempt stops them through Slurm, with the grace
        # to checkpoint: a SIGKILL from the sweep would lose their steps since the last checkpoint.
        _job(session, "slurm", 2, lease_s=-60)
        session.add(Attempt(job_id="slurm", attempt=1, executor_id="4242"))
        session.commit()
        old = _plant(planted, TORCHYARD_JOB_ID="live", TORCHYARD_ATTEMPT="1", TORCHYARD_RUN_DIR=f"{runs}/live")
        lapsed = _plant(planted, TORCHYARD_JOB_ID="lapsed", TORCHYARD_ATTEMPT="1", TORCHYARD_RUN_DIR=f"{runs}/lapsed")
        held = _plant(planted, TORCHYARD_JOB_ID="live", TORCHYARD_ATTEMPT="2", TORCHYARD_RUN_DIR=f"{runs}/live/workdir")
        engine = _plant(planted, TORCHYARD_JOB_ID="slurm", TORCHYARD_ATTEMPT="1", TORCHYARD_RUN_DIR=f"{runs}/slurm")
        other_stack = _plant(planted, TORCHYARD_JOB_ID="gone", TORCHYARD_ATTEMPT="1", TORCHYARD_RUN_DIR="/elsewhere/runs/gone")
        unmarked = _plant(planted)
        # Wait for each planted interpreter to be running with its environment readable.
        wait_until(lambda: all(psutil.Process(p.pid).environ() is not None for p in planted), 30, what="planted processes")
        ended = end_leftovers(session, settings)
    assert sorted(ended) == sorted([old.pid, lapsed.pid])
    assert old.wait(30) == -9 and lapsed.wait(30) == -9
    for kept in (held, engine, other_stack, unmarked):
        assert kept.poll() is None
