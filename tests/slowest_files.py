"""Every run ends with its slowest test files, so the next file that eats the suite's time budget shows.

A file's time is the sum of its tests' setup, call and teardown (module fixtures land on the test that started
or ended them); a subtest's time is already in its test's call, so it is not added again (schemathesis reports each
operation it runs as a subtest). Under pytest-xdist the workers' reports reach the controller through the same hook,
so the controller, the one process that prints, adds them up; a worker prints nothing. The table comes before
pytest's short summary and its final line, which stays the last line of the run.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from _pytest.subtests import SubtestReport

SHOWN = 20


def file_of(nodeid: str) -> str:
    """``tests/x/test_y.py::Case::test[p]`` -> ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def slowest(times: dict[str, float], count: int = SHOWN) -> list[tuple[str, float]]:
    """The ``count`` files that took longest, longest first; ties in name order, so the table is stable."""
    return sorted(times.items(), key=lambda item: (-item[1], item[0]))[:count]


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
        rows = slowest(self.times)
        terminalreporter.write_sep("=", f"{len(rows)} slowest test files (setup + call + teardown)")
        for name, seconds in rows:
            terminalreporter.write_line(f"{seconds:9.2f}s {name}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker: the controller sums and prints
        config.pluginmanager.register(SlowestFiles(), "torchyard-slowest-files")
