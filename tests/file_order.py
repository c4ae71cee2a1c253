"""Longest test files first, so that a run's last minutes are not one slow file started late.

pytest-xdist's ``--dist loadfile`` hands each process whole files in collection order, and by default reorders them
by their number of tests: a file of two torchrun tests (two minutes) went out after the API's files of a hundred
quick ones, and the run ended with one process on it and the others idle. With ``--no-loadscope-reorder`` (the
Makefile) the order is this plugin's: each file's time in the last runs on this machine (pytest's cache, written by
tests/slowest_files.py) or, on a fresh clone, in ``tests/file_times.json`` (a full run's, checked in:
``python -m tests.file_order`` rewrites it from the cache); a file in neither counts as ``UNKNOWN_SLOW_S`` when it
is marked slow and as nothing otherwise. Within a file the order is untouched.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

log = logging.getLogger(__name__)

CHECKED_IN = Path(__file__).with_name("file_times.json")
CACHE_KEY = "torchyard/file-times"
UNKNOWN_SLOW_S = 60.0  # a new slow file: about the median of the slow files measured so far


def file_of(nodeid: str) -> str:
    """``tests/x/test_y.py::Case::test[p]`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def weight(name: str, times: Mapping[str, float], slow: bool) -> float:
    if name in times:
        return times[name]
    return UNKNOWN_SLOW_S if slow else 0.0


def ordered(nodeids: Sequence[str], times: Mapping[str, float], slow_files: set[str]) -> list[int]:
    """Indexes of ``nodeids`` with their files longest first; ties and each file's own tests keep their order."""
    first_seen: dict[str, int] = {}
    for i, nodeid in enumerate(nodeids):
        first_seen.setdefault(file_of(nodeid), i)
    key = {name: (-weight(name, times, name in slow_files), at) for name, at in first_seen.items()}
    return sorted(range(len(nodeids)), key=lambda i: key[file_of(nodeids[i])])


def known_times(config: pytest.Config) -> dict[str, float]:
    times: dict[str, float] = {}
    if CHECKED_IN.exists():
        times.update(json.loads(CHECKED_IN.read_text()))
    cache = getattr(config, "cache", None)  # none under -p no:cacheprovider
    if cache is not None:
        times.update(cache.get(CACHE_KEY, {}))
    return times


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = {file_of(item.nodeid) for item in items if item.get_closest_marker("slow")}
    order = ordered([item.nodeid for item in items], known_times(config), slow_files)
    items[:] = [items[i] for i in order]


def main() -> int:
    """Rewrite tests/file_times.json from this checkout's pytest cache (after a full run)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cached = Path(__file__).parent.parent / ".pytest_cache" / "v" / CACHE_KEY
    if not cached.exists():
        log.error("no file times in %s: run the whole suite first (make test)", cached)
        return 1
    times = json.loads(cached.read_text())
    CHECKED_IN.write_text(json.dumps({k: round(v, 1) for k, v in sorted(times.items())}, indent=1) + "\n")
    log.info("%d files written to %s", len(times), CHECKED_IN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
