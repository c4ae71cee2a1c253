"""Each pytest run prints its slowest test files, summed per file, before pytest's final line; under
pytest-xdist too, where the controller adds up what its workers ran."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _pytest.subtests import SubtestContext, SubtestReport
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import inner_pytest_env
from tests.slowest_files import SHOWN, SlowestFiles, file_of, slowest

# The slow file's time is in its fixture's setup and teardown as well as its tests' calls: all of it counts.
# test_two burns CPU in pytest's process, test_one in a child: the table's CPU columns must show both.
SLOW = textwrap.dedent('''
    import subprocess
    import sys
    import time
    import pytest

    BURN = "import time\\nwhile time.process_time() < 0.3: pass"

    @pytest.fixture
    def pause():
        time.sleep(0.2)
        yield
        time.sleep(0.2)

    def test_one(pause):
        subprocess.run([sys.executable, "-c", BURN], check=True)

    def test_two():
        start = time.process_time()
        while time.process_time() - start < 0.3:
            pass
''')


def _run(tmp_path: Path, *args: str) -> list[str]:
    (tmp_path / "conftest.py").write_text("from tests.slowest_files import pytest_configure  # noqa: F401\n")
    (tmp_path / "test_slow.py").write_text(SLOW)
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    (tmp_path / "test_failing.py").write_text("def test_failing():\n    assert False\n")
    # Only the plugins the run needs: each of the run's processes would import every installed one (schemathesis, ...).
    env = inner_pytest_env()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-ra", "-q", *args, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the one failing test
    return proc.stdout.strip().splitlines()


@pytest.mark.parametrize("xdist", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["one-process", "xdist"])
def test_the_slowest_files_are_listed_before_the_final_line(tmp_path: Path, xdist: list[str]) -> None:
    lines = _run(tmp_path, *xdist)
    heading = next(i for i, line in enumerate(lines) if "slowest test files" in line)
    assert "cpu: in pytest" in lines[heading + 1], lines[heading:]
    rows = [re.fullmatch(r"\s*([0-9.]+)s\s+([0-9.]+)s\s+([0-9.]+)s  (\S+)", line) for line in lines[heading + 2:heading + 5]]
    assert all(rows), lines[heading:]
    assert rows[0] and rows[0][4] == "test_slow.py"
    named = {m[4]: (float(m[1]), float(m[2]), float(m[3])) for m in rows if m}
    assert set(named) == {"test_slow.py", "test_quick.py", "test_failing.py"}
    wall, own, children = named["test_slow.py"]
    assert wall >= 0.8  # setup and teardown 0.2 s each, and two calls of at least 0.2 s
    assert own >= 0.3 and children >= 0.3, lines[heading:]  # test_two's loop, test_one's child
    assert named["test_quick.py"][2] < 0.3  # the child's CPU is counted once, on the file that ran it
    assert lines[heading + 5].split()[:2] == ["all", "files"], lines[heading:]
    assert lines.index("FAILED test_failing.py::test_failing - assert False") > heading  # pytest's own summary after
    assert re.fullmatch(r"1 failed, 3 passed in .*", lines[-1]), lines[-1]


@given(st.dictionaries(st.text(min_size=1), st.floats(min_value=0, max_value=1e6), max_size=50))
def test_slowest_is_the_longest_first_and_at_most_twenty(times: dict[str, float]) -> None:
    rows = slowest(times)
    assert len(rows) == min(SHOWN, len(times))
    assert [t for _, t in rows] == sorted((t for _, t in rows), reverse=True)
    assert all(t <= rows[-1][1] for name, t in times.items() if (name, t) not in rows) if rows else not times


def test_a_file_is_its_node_ids_path() -> None:
    assert file_of("tests/x/test_y.py::Case::test_z[a::b]") == "tests/x/test_y.py"
    assert file_of("tests/x/test_y.py") == "tests/x/test_y.py"


def test_a_subtests_time_is_counted_once_in_its_tests_call() -> None:
    """A subtest's report repeats part of its test's call: the file's time is the test's, not their sum."""

    def report(kind: type[pytest.TestReport], when: str, duration: float) -> pytest.TestReport:
        made = kind("tests/x/test_y.py::test_z", ("tests/x/test_y.py", 1, "test_z"), {}, "passed", None, when, duration=duration)
        if isinstance(made, SubtestReport):
            made.context = SubtestContext(msg="GET /v1/jobs", kwargs={})
        return made

    plugin = SlowestFiles()
    for made in (report(pytest.TestReport, "setup", 1.0), report(SubtestReport, "call", 2.0), report(SubtestReport, "call", 3.0),
                 report(pytest.TestReport, "call", 5.5), report(pytest.TestReport, "teardown", 0.5)):
        plugin.pytest_runtest_logreport(made)
    assert plugin.times == {"tests/x/test_y.py": 7.0}
