"""A uid per job, without torchrun: the choice of uid (property-tested), the lease in real SQL, the settings,
the run directory handed over, files a job planted, and every process of a uid ended (as root only)."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlmodel import Session

from jobs.settings import Settings
from jobs.store.db import get_engine
from jobs.store.models import Job, JobUid, Status
from tests.uid_blocks import uid_block
from worker.sandbox import cgroups, processes, run_dirs, uid_leases
from worker.sandbox.job_users import JobIdentity, isolation_mode, missing_caps, owner_problem, pick_uid, uid_processes
from worker.tail import EventTail

log = logging.getLogger(__name__)

RANGE = (20000, 20009)
ROOT = os.geteuid() == 0


@st.composite
def ranges_and_used(draw: st.DrawFn) -> tuple[tuple[int, int], set[int]]:
    low = draw(st.integers(1, 60000))
    high = draw(st.integers(low, low + 40))
    used = draw(st.sets(st.integers(low - 5, high + 5)))
    return (low, high), used


@given(ranges_and_used(), st.text(min_size=1, max_size=32))
def test_pick_uid_is_a_free_uid_of_the_range_or_none_when_all_are_used(case: tuple[tuple[int, int], set[int]], job_id: str) -> None:
    (low, high), used = case
    uid = pick_uid((low, high), used, job_id)
    free = set(range(low, high + 1)) - used
    if free:
        assert uid in free
    else:
        assert uid is None
    assert pick_uid((low, high), used, job_id) == uid  # a pure function of its inputs


@given(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8))
def test_a_one_owner_worker_refuses_only_another_owner(bound: str, owner: str) -> None:
    assert owner_problem(None, owner) is None
    assert owner_problem(owner, owner) is None
    problem = owner_problem(bound, owner)
    assert (problem is None) == (bound == owner)
    if problem:
        assert "TORCHYARD_JOB_UIDS" in problem and "TORCHYARD_SINGLE_USER" in problem


@pytest.mark.parametrize("value", ["0-100", "100-50", "abc", "20000", f"{os.getuid()}-{os.getuid() + 10}", "-5-10"])
def test_a_bad_uid_range_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(job_uids=value)
    assert "TORCHYARD_JOB_UIDS" in str(info.value)


def test_uid_mode_needs_the_range_and_the_capabilities(tmp_path: Path) -> None:
    assert Settings(job_uids="20000-29999").job_uids == (20000, 29999)
    assert isolation_mode(Settings(single_user=True)).uids is None
    assert isolation_mode(Settings()).one_owner
    assert not isolation_mode(Settings(single_user=True)).one_owner
    assert not isolation_mode(Settings(executor="slurm")).one_owner
    if ROOT:
        assert isolation_mode(Settings(job_uids="20000-29999")).uids == (20000, 29999)
    assert missing_caps(0) in ([], ["CHOWN", "FOWNER", "KILL", "SETGID", "SETUID"])
    assert missing_caps((1 << 6) | (1 << 7)) in ([], ["CHOWN", "FOWNER", "KILL"])


def _running_job(session: Session, attempt: int = 1) -> Job:
    job = Job(owner="alice", name="t", spec={}, status=Status.RUNNING.value, attempt=attempt)
    session.add(job)
    session.commit()
    return job


def test_uid_leases_are_unique_and_stale_ones_are_taken_over(settings: Settings) -> None:
    with Session(get_engine(settings.database_url), expire_on_commit=False) as session:
        jobs = [_running_job(session) for _ in range(10)]
        uids = [uid_leases.acquire(session, RANGE, job.id, 1, "w1") for job in jobs]
        assert sorted(uids) == list(range(RANGE[0], RANGE[1] + 1))
        assert uid_leases.acquire(session, RANGE, jobs[0].id, 1, "w1") == uids[0]  # held: the same again
        extra = _running_job(session)
        with pytest.raises(uid_leases.NoFreeUid):
            uid_leases.acquire(session, RANGE, extra.id, 1, "w2")
        uid_leases.release(session, uids[3], jobs[3].id, 1)
        assert uid_leases.acquire(session, RANGE, extra.id, 1, "w2") == uids[3]
        # A job requeued by the reconciler (its worker vanished) no longer runs attempt 1: its row is stale.
        jobs[5].status, jobs[5].attempt = Status.QUEUED.value, 2
        session.add(jobs[5])
        session.commit()
        other = _running_job(session)
        assert uid_leases.acquire(session, RANGE, other.id, 1, "w3") == uids[5]
        assert uid_leases.held(session, other.id, 1) == uids[5]
        assert uid_leases.held(session, jobs[5].id, 1) is None
        assert session.get(JobUid, uids[5]).worker_id == "w3"  # type: ignore[union-attr]


def test_concurrent_workers_never_lease_one_uid_twice(settings: Settings) -> None:
    engine = get_engine(settings.database_url)
    with Session(engine, expire_on_commit=False) as session:
        jobs = [_running_job(session) for _ in range(8)]
    got: list[int] = []
    errors: list[BaseException] = []

    def lease(job_id: str) -> None:
        try:
            with Session(engine) as own:
                got.append(uid_leases.acquire(own, RANGE, job_id, 1, f"w-{job_id}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=lease, args=(job.id,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(got) == len(set(got)) == 8


def test_a_planted_fifo_or_link_neither_hangs_nor_redirects_the_worker(tmp_path: Path) -> None:
    secret = tmp_path / "service.db"
    secret.write_text('{"seq": 1, "type": "metric", "values": {"x": 1}}\n')
    run = tmp_path / "run"
    (run / "logs" / "attempt-2").mkdir(parents=True)
    (run / "events.jsonl").symlink_to(secret)
    os.mkfifo(run / "error.json")
    (run / "spec.json").symlink_to(secret)
    os.rmdir(run / "logs" / "attempt-2")
    (run / "logs" / "attempt-2").symlink_to(tmp_path)
    assert EventTail(run / "events.jsonl").read() == []
    with pytest.raises(OSError):
        run_dirs.read_job_bytes(run / "error.json")
    run_dirs.scrub(run, 2)
    assert not (run / "events.jsonl").exists() and not (run / "error.json").exists()
    assert not (run / "spec.json").is_symlink() and not (run / "logs" / "attempt-2").is_symlink()
    assert secret.read_text().startswith('{"seq": 1')


@pytest.mark.skipif(not ROOT, reason="changing owners and uids needs root")
def test_the_run_directory_is_handed_to_the_job_uid(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    (run / "checkpoints" / "step-1" / "w.bin").write_text("w")
    (run / "code").mkdir()
    (run / "code" / "train.py").write_text("")
    os.chmod(run / "code" / "train.py", 0o444)
    shared = tmp_path / "elsewhere.bin"
    shared.write_text("adopted")
    os.link(shared, run / "checkpoints" / "adopted.bin")
    outside = tmp_path / "service-settings"
    outside.write_text("secret")
    os.chmod(outside, 0o600)
    (run / "checkpoints" / "evil").symlink_to(outside)
    (run / "checkpoints" / "evil-dir").symlink_to(tmp_path)
    os.chown(run / "checkpoints" / "step-1", 20003, 20003)
    os.chmod(run / "checkpoints" / "step-1", 0o700)  # an earlier attempt under another uid closed it
    run_dirs.hand_over(run, 20001, RANGE)
    for rel in ("", "checkpoints", "checkpoints/step-1"):
        st_ = (run / rel).stat()
        assert (st_.st_uid, st_.st_gid, stat.S_IMODE(st_.st_mode)) == (20001, os.getgid(), 0o2770), rel
    assert (run / "spec.json").stat().st_uid == 20001
    assert (run / "checkpoints" / "step-1" / "w.bin").stat().st_uid == 20001
    assert shared.stat().st_uid == os.getuid()  # a hard link is never given away
    # Links are never followed: what they point at keeps its owner and mode.
    assert (outside.stat().st_uid, stat.S_IMODE(outside.stat().st_mode)) == (os.getuid(), 0o600)
    assert tmp_path.stat().st_uid == os.getuid() and stat.S_IMODE(tmp_path.stat().st_mode) != 0o2770
    assert (run / "code" / "train.py").stat().st_uid == os.getuid()


def _names(uid: int) -> list[str]:
    names = []
    for proc in uid_processes(uid):
        with contextlib.suppress(psutil.Error):
            names.append(proc.name())
    return sorted(names)


@pytest.mark.skipif(not ROOT, reason="running as another uid needs root or CAP_SETUID")
def test_nothing_of_a_uid_outlives_its_attempt(tmp_path: Path) -> None:
    """A detached grandchild (setsid env -i) and a double-forked daemon are gone within a second of the kill."""
    # This process's own uid and cgroup: every process of the uid is killed, and a second run beside this one has its own.
    uid = uid_block()[1]
    cgroup = cgroups.create(f"test-job-users-{uid}", "job", 1)
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(run, uid, uid)
    identity = JobIdentity(uid, cgroup)
    script = "setsid env -i sleep 300 & (sh -c 'sleep 300 &' &); exec sleep 300"
    proc = processes.spawn(["sh", "-c", script], {"PATH": os.defpath}, run, run / "launcher.log", identity=identity)
    # Three sleeps: the exec, the setsid one, the daemon. Until all three are sleeping, a shell of the daemon's
    # chain may be counted in their place, or neither it nor the sleep it just forked (one scan of /proc is not
    # atomic): seen once at load 12, two counted after a count of three.
    deadline = time.monotonic() + 30  # a few process starts, on a machine that may be busy
    while _names(uid) != ["sleep"] * 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _names(uid) == ["sleep"] * 3
    took = processes.end_identity(identity)
    log.info("no process of uid %d left %.1f ms after the kill (cgroup: %s)", uid, took * 1000, cgroup)
    assert uid_processes(uid) == [] and took < 3
    assert proc.wait(5) == -9
    assert cgroup is None or not cgroup.exists()
    status = subprocess.run(["sh", "-c", "echo alive"], capture_output=True, text=True)
    assert status.stdout == "alive\n"  # the worker's own processes were spared


def test_a_worker_running_jobs_as_itself_is_bound_to_its_first_owner(settings: Settings, redis_url: str) -> None:
    from redis import Redis

    from worker.sandbox.isolation import Isolation

    redis = Redis.from_url(redis_url)
    bound = Isolation(settings.model_copy(update={"single_user": False, "job_uids": None}), "w-bound")
    assert bound.mode.one_owner and "TORCHYARD_SINGLE_USER" in bound.mode.description
    assert bound.owner_refused(redis, "alice") is None
    assert bound.owner_refused(redis, "alice") is None
    refusal = bound.owner_refused(redis, "bob")
    assert refusal is not None and "TORCHYARD_JOB_UIDS" in refusal and "alice" not in refusal
    # Another worker is bound on its own; TORCHYARD_SINGLE_USER=true takes every owner.
    assert Isolation(settings.model_copy(update={"single_user": False}), "w-other").owner_refused(redis, "bob") is None
    shared = Isolation(settings.model_copy(update={"single_user": True}), "w-bound")
    assert shared.owner_refused(redis, "bob") is None
