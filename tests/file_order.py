"""The longest test files start first, so the run does not end with one process alone on a long file.

pytest-xdist hands each process a whole file (``--dist loadfile``) as it frees up, in collection order; left to
itself it orders files by their number of tests, which puts the long live files (a compose build, a gang on four
hosts, a Slurm cluster: few tests, minutes each) last, where one of them can run alone for minutes while the other
processes idle. Longest first (the LPT rule) ends the processes within about one short file of each other.

A file's time comes from ``tests/file_times.json``, the wall seconds each file took in a full run
(``pytest --record-file-times`` rewrites it). A file not in it yet is guessed from its marks: a file that starts
services or torchrun as long as the typical live file, a quick one as a quick one. A stale time only orders the files
less well; nothing else reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

TIMES_FILE = Path(__file__).with_name("file_times.json")
GUESS_SLOW_S = 40.0  # a live file not measured yet: about the median of the measured live files
GUESS_QUICK_S = 1.0

T = TypeVar("T")


def file_of(nodeid: str) -> str:
    """``tests/x/test_y.py::Case::test[p]`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def load_times(path: Path = TIMES_FILE) -> dict[str, float]:
    try:
        return {str(name): float(seconds) for name, seconds in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no table: files keep pytest's order by marks alone


def longest_first(items: Sequence[T], file_of: Callable[[T], str], seconds: Callable[[str], float]) -> list[T]:
    """``items`` with each file's items together, files by ``seconds`` longest first; ties and the items of one file
    keep their order (a file's tests run in the order they are written)."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(file_of(item), len(first_seen))
    return sorted(items, key=lambda item: (-seconds(file_of(item)), first_seen[file_of(item)]))


def record(times: dict[str, float], path: Path = TIMES_FILE) -> None:
    """This run's files' times over the table's (a partial run updates its own files and keeps the others)."""
    table = {**load_times(path), **times}
    path.write_text(json.dumps({name: round(s, 1) for name, s in sorted(table.items())}, indent=0) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-file-times", action="store_true",
                     help=f"write each test file's wall time of this run to {TIMES_FILE.name} (orders the next runs)")


@pytest.hookimpl(trylast=True)  # after the marks' deselection, on what will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    times = load_times()
    slow_files = {file_of(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def seconds(name: str) -> float:
        return times.get(name, GUESS_SLOW_S if name in slow_files else GUESS_QUICK_S)

    items[:] = longest_first(items, lambda item: file_of(item.nodeid), seconds)
