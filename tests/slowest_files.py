"""Every run ends with its slowest test files, so the next file that eats the suite's time budget shows.

A file's time is the sum of its tests' setup, call and teardown (module fixtures land on the test that started
or ended them); a subtest's time is already in its test's call, so it is not added again (schemathesis reports each
operation it runs as a subtest). Under pytest-xdist the workers' reports reach the controller through the same hook,
so the controller, the one process that prints, adds them up; a worker prints nothing. The table comes before
pytest's short summary and its final line, which stays the last line of the run.

Beside the wall time, the CPU time each file cost: on the two cores CI has, the suite is bound by CPU, so a file that
waits is cheap and one that burns is not. "in pytest" is the test process's own (in-process API clients, hypothesis,
schemathesis); "children" is what its reaped child processes and theirs used (the API, workers, torchrun and the
ranks), as the kernel reports it once a child is waited for. Each phase's report carries the CPU used since the
previous report of that process, so nothing is counted twice and the time between tests lands on the next one.
"""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest
from _pytest.subtests import SubtestReport

from tests import file_order, service_forks
from tests.file_order import file_of

SHOWN = 20
CPU_PROPERTY = "torchyard_cpu_s"  # the user property each report's CPU stamp travels in (to the xdist controller too)


def slowest(times: dict[str, float], count: int = SHOWN) -> list[tuple[str, float]]:
    """The ``count`` files that took longest, longest first; ties in name order, so the table is stable."""
    return sorted(times.items(), key=lambda item: (-item[1], item[0]))[:count]


def cpu_used() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its children that have been waited for: the service
    processes forked for it (tests/service_forks.py) among them, though their parent is the fork server."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + service_forks.SERVER.cpu_s()


class CpuStamps:
    """In every process that runs tests: each report carries the CPU used since this process's previous report."""

    def __init__(self) -> None:
        self.last = cpu_used()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
        report = yield
        now = cpu_used()
        report.user_properties.append((CPU_PROPERTY, (now[0] - self.last[0], now[1] - self.last[1])))
        self.last = now
        return report


class SlowestFiles:
    def __init__(self, record_times: bool = False) -> None:
        self.record_times = record_times  # --record-file-times: the files' times order the next runs (tests/file_order.py)
        self.times: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = file_of(report.nodeid)
        # A subtest's time is a part of its test's call, whose own report holds it; its CPU stamp is its own.
        if not isinstance(report, SubtestReport):
            self.times[name] += report.duration
        for key, value in report.user_properties:
            if key == CPU_PROPERTY:
                self.cpu[name][0] += value[0]
                self.cpu[name][1] += value[1]

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.times:
            return
        if self.record_times:
            file_order.record(self.times)
        rows = slowest(self.times)
        terminalreporter.write_sep("=", f"{len(rows)} slowest test files (setup + call + teardown)")
        terminalreporter.write_line(f"{'wall':>10} {'cpu: in pytest':>15} {'children':>9}  file")
        for name, seconds in rows:
            own, children = self.cpu[name]
            terminalreporter.write_line(f"{seconds:9.2f}s {own:14.1f}s {children:8.1f}s  {name}")
        own_total = sum(c[0] for c in self.cpu.values())
        children_total = sum(c[1] for c in self.cpu.values())
        terminalreporter.write_line(f"{'all files':>10} {own_total:14.1f}s {children_total:8.1f}s  "
                                    f"(CPU of the processes that ran tests, and of their reaped children)")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuStamps(), "torchyard-cpu-stamps")
    if not hasattr(config, "workerinput"):  # an xdist worker: the controller sums and prints
        config.pluginmanager.register(SlowestFiles(config.getoption("record_file_times", False)), "torchyard-slowest-files")
