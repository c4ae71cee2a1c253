"""Fails any test that starts torchrun while the run leaves slow tests out.

The quick selection (``-m "not slow"``) promises no torchrun. torchrun is often started by a worker
process, not by the test itself, so nothing in the test's own code path can refuse it; instead a
thread samples this process's descendants while each test runs and the test fails, naming the command
line, when one of them is ``torch.distributed.run``. torchrun needs a second or more just to import
torch, far longer than the sampling interval, so a launch is not missed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psutil
import pytest

INTERVAL_S = 0.25
_state: dict[str, bool] = {"armed": False}


def is_torchrun(cmdline: list[str]) -> bool:
    """``python -m torch.distributed.run ...`` or the ``torchrun`` console script."""
    if "torch.distributed.run" in cmdline:
        return True
    return any(part.rsplit("/", 1)[-1] == "torchrun" for part in cmdline[:2])


def _under_nested_pytest(proc: psutil.Process, me: psutil.Process) -> bool:
    """A pytest run started by a test guards its own selection; its torchrun is not this run's."""
    for parent in proc.parents():
        if parent.pid == me.pid:
            return False
        if "pytest" in parent.cmdline():
            return True
    return False


class _Watch:
    def __init__(self) -> None:
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchrun-guard", daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(INTERVAL_S):
            for proc in me.children(recursive=True):
                try:
                    cmdline = proc.cmdline()
                    if not is_torchrun(cmdline) or _under_nested_pytest(proc, me):
                        continue
                except psutil.Error:
                    continue
                if (line := " ".join(cmdline)) not in self.seen:
                    self.seen.append(line)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def pytest_deselected(items: list[pytest.Item]) -> None:
    # Only a marker expression leaves slow tests out on purpose; ``-k`` picks tests by name and promises nothing.
    if any(item.get_closest_marker("slow") and "slow" in (item.config.option.markexpr or "") for item in items):
        _state["armed"] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not _state["armed"]:
        return (yield)
    with _Watch() as watch:
        result = yield
    if watch.seen:
        raise pytest.fail.Exception(
            f"{item.nodeid} started torchrun in a run that leaves out slow tests; mark its module "
            f"`pytestmark = pytest.mark.slow`. Started: {watch.seen[0][:300]}")
    return result
