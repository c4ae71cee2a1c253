"""Every run ends with its slowest test files, so the next file that eats the suite's time budget shows.

A file's time is the sum of its tests' setup, call and teardown (module fixtures land on the test that started
or ended them); a subtest's time is already in its test's call, so it is not added again (schemathesis reports each
operation it runs as a subtest). Under pytest-xdist the workers' reports reach the controller through the same hook,
so the controller, the one process that prints, adds them up; a worker prints nothing. The table comes before
pytest's short summary and its final line, which stays the last line of the run.

The same times decide the order files start in: pytest-xdist hands a process the next file when it finishes one, so
the suite ends when its last long file does. Started longest first (``file_times.json``, a run's times; a file not
listed goes after them, in collection order), the long live files overlap with each other and the many short ones
fill in around them, instead of one long file starting when the rest are done. ``make test`` passes
``--no-loadscope-reorder``, else xdist would put files with many tests first instead. ``TORCHYARD_FILE_TIMES=PATH``
writes this run's times there (``tests/file_times.json`` to refresh the order).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
from _pytest.subtests import SubtestReport

SHOWN = 20
FILE_TIMES = Path(__file__).with_name("file_times.json")


def file_of(nodeid: str) -> str:
    """``tests/x/test_y.py::Case::test[p]`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def slowest(times: dict[str, float], count: int = SHOWN) -> list[tuple[str, float]]:
    """The ``count`` files that took longest, longest first; ties in name order, so the table is stable."""
    return sorted(times.items(), key=lambda item: (-item[1], item[0]))[:count]


def longest_first(files: list[str], times: dict[str, float]) -> list[str]:
    """The files in the order they start: by recorded time, longest first, the ones without a time after them in their
    own order (pure)."""
    return sorted(files, key=lambda f: -times.get(f, 0.0))


def recorded_times(path: Path = FILE_TIMES) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(file_of(item.nodeid), []).append(item)
    items[:] = [item for f in longest_first(list(by_file), recorded_times()) for item in by_file[f]]


class SlowestFiles:
    def __init__(self) -> None:
        self.times: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if isinstance(report, SubtestReport):
            return  # a part of its test's call, whose own report already holds its time
        self.times[file_of(report.nodeid)] += report.duration

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.times:
            return
        if out := os.environ.get("TORCHYARD_FILE_TIMES"):
            Path(out).write_text(json.dumps({f: round(t, 1) for f, t in slowest(self.times, len(self.times))}, indent=1) + "\n")
        rows = slowest(self.times)
        terminalreporter.write_sep("=", f"{len(rows)} slowest test files (setup + call + teardown)")
        for name, seconds in rows:
            terminalreporter.write_line(f"{seconds:9.2f}s {name}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker: the controller sums and prints
        config.pluginmanager.register(SlowestFiles(), "torchyard-slowest-files")
