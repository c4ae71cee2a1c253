"""Environments the slow tests build once per machine and reuse: a directory per kind and key under
``TORCHYARD_TEST_CACHE`` (default ``~/.cache/torchyard-tests``), built the first time a run asks for it and
shared by every later run, a fresh clone's included, for as long as the key (what decides its content) is the
same. A change to what the key covers builds a new one; the least recently used beyond ``KEPT`` of a kind go."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

KEPT = 3  # environments kept per kind, the most recently used: up to a GB each


def cache_root() -> Path:
    return Path(os.environ.get("TORCHYARD_TEST_CACHE") or Path.home() / ".cache" / "torchyard-tests")


@contextmanager
def cached(kind: str, key: str, build: Callable[[Path], str]) -> Iterator[Path]:
    """The directory of ``kind`` for ``key``, built by ``build(home)`` in an empty ``home`` unless a run on this
    machine built it already; ``build`` returns what to keep in its ``complete`` marker (a log's tail). Nobody
    removes it while the ``with`` block runs."""
    home = cache_root() / f"{kind}-{key}"
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / f"{home.name}.lock").open("a") as lock:
        # Shared from here to the block's end: other runs may use it too, none may remove it meanwhile. A run
        # beside this one that finds it built goes on at once; asking for the lock exclusively first made it wait
        # for this whole session to end (15 minutes of a side-by-side run).
        fcntl.flock(lock, fcntl.LOCK_SH)
        if not (home / "complete").is_file():
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build for every test process and run on the machine
            if not (home / "complete").is_file():  # not built by a run that held the lock before this one
                shutil.rmtree(home, ignore_errors=True)  # a build that died half-way
                home.mkdir()
                (home / "complete").write_text(build(home))
            fcntl.flock(lock, fcntl.LOCK_SH)
        (home / "complete").touch()  # its last use, for _forget_least_recent
        _forget_least_recent(home.parent, kind)
        yield home


def _forget_least_recent(cache: Path, kind: str) -> None:
    """All but the KEPT most recently used environments of ``kind`` (of an earlier key: another pyproject.toml,
    requirements file or branch), each once no run holds it."""
    def used(env: Path) -> float:  # one whose build died half-way: never
        return (env / "complete").stat().st_mtime if (env / "complete").is_file() else 0.0

    built = sorted((d for d in cache.glob(f"{kind}-*") if d.is_dir()), key=used, reverse=True)
    for other in built[KEPT:]:
        with (cache / f"{other.name}.lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use by a run beside this one
            shutil.rmtree(other, ignore_errors=True)
