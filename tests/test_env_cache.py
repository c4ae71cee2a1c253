"""The slow tests' environment cache: built once per key, reused after, a half-built one rebuilt, the least recently
used beyond KEPT removed unless a run holds them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from tests import env_cache


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHYARD_TEST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _builder(calls: list[Path]):
    def build(home: Path) -> str:
        assert list(home.iterdir()) == []  # always an empty directory
        calls.append(home)
        (home / "env").write_text("built")
        return "log tail"

    return build


def test_a_key_is_built_once_and_reused() -> None:
    calls: list[Path] = []
    with env_cache.cached("kind", "k1", _builder(calls)) as home:
        assert (home / "env").read_text() == "built" and (home / "complete").read_text() == "log tail"
    with env_cache.cached("kind", "k1", _builder(calls)) as again:
        assert again == home
    assert calls == [home]
    with env_cache.cached("kind", "k2", _builder(calls)) as other:
        assert other != home
    assert len(calls) == 2


def test_a_build_that_died_half_way_is_built_again(cache: Path) -> None:
    half = cache / "kind-k1"
    half.mkdir(parents=True)
    (half / "stale").write_text("left by a killed build")
    calls: list[Path] = []
    with env_cache.cached("kind", "k1", _builder(calls)) as home:
        assert not (home / "stale").exists() and (home / "env").is_file()
    assert calls == [half]


def test_only_the_kept_most_recent_of_a_kind_stay_and_one_in_use_is_never_removed(cache: Path) -> None:
    calls: list[Path] = []
    for i in range(env_cache.KEPT):
        with env_cache.cached("kind", f"old{i}", _builder(calls)):
            pass
        os.utime(cache / f"kind-old{i}" / "complete", (1000 + i, 1000 + i))  # old0 the least recently used
    with env_cache.cached("other", "x", _builder(calls)):
        pass  # another kind counts apart
    with (cache / "kind-old0.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # a run beside this one uses old0
        with env_cache.cached("kind", "new", _builder(calls)):
            pass
        assert (cache / "kind-old0").is_dir()
    with env_cache.cached("kind", "newer", _builder(calls)):
        pass
    left = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert left == ["kind-new", "kind-newer", "kind-old2", "other-x"]
