"""A job's compile caches: one directory per owner on a host, never another owner's."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from jobs.settings import Settings
from worker.compile_cache import cache_name, compile_cache_env

OWNERS = st.text(min_size=1, max_size=64)
UIDS = st.none() | st.integers(min_value=1000, max_value=2**31 - 1)


@given(st.binary(min_size=32, max_size=32), OWNERS, OWNERS, UIDS, UIDS)
def test_the_cache_directory_is_the_same_for_one_owner_and_uid_and_differs_otherwise(salt: bytes, a: str, b: str,
                                                                                       ua: int | None, ub: int | None) -> None:
    assert cache_name(salt, a, ua) == cache_name(salt, a, ua)
    assert (cache_name(salt, a, ua) == cache_name(salt, b, ub)) == ((a, ua) == (b, ub))


@given(OWNERS, UIDS)
def test_another_hosts_salt_gives_other_names(owner: str, uid: int | None) -> None:
    assert cache_name(b"\x01" * 32, owner, uid) != cache_name(b"\x02" * 32, owner, uid)


def _settings(tmp_path: Path, **kw) -> Settings:
    return Settings(database_url="sqlite://", runs_dir=tmp_path / "runs", **kw)


def test_a_worker_of_one_owner_gives_each_of_its_jobs_the_same_private_cache(tmp_path: Path) -> None:
    settings = _settings(tmp_path)  # no uids, not single-user: this worker runs one owner's jobs
    first = compile_cache_env(settings, "alice", None, tmp_path / "runs" / "job1")
    again = compile_cache_env(settings, "alice", None, tmp_path / "runs" / "job2")
    assert first == again
    assert set(first) == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    base = Path(first["TORCHINDUCTOR_CACHE_DIR"]).parent
    assert base.parent == tmp_path / "runs" / ".compile-cache" and "alice" not in base.name
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert stat.S_IMODE(base.parent.stat().st_mode) == 0o711  # reachable by name, not listable
    assert stat.S_IMODE((base.parent / ".salt").stat().st_mode) == 0o600
    assert compile_cache_env(settings, "bob", None, tmp_path / "runs" / "job3") != first


def test_a_single_user_worker_keeps_each_jobs_cache_in_its_run_directory(tmp_path: Path) -> None:
    settings = _settings(tmp_path, single_user=True)  # every owner's jobs as one user: nothing is private to an owner
    run_dir = tmp_path / "runs" / "job1"
    env = compile_cache_env(settings, "alice", None, run_dir)
    assert Path(env["TRITON_CACHE_DIR"]).parent == run_dir / ".compile-cache"
    assert compile_cache_env(settings, "alice", None, tmp_path / "runs" / "job2") != env
    assert not (tmp_path / "runs" / ".compile-cache").exists() or os.listdir(tmp_path / "runs" / ".compile-cache") == []
