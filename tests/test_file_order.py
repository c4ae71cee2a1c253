"""The run starts its longest test files first (tests/file_order.py), each file's tests in their own order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.file_order import CACHE_KEY, UNKNOWN_SLOW_S, file_of, ordered, weight
from tests.helpers import ROOT

FILES = st.sampled_from([f"tests/test_{c}.py" for c in "abcdef"])
NODEIDS = st.lists(st.tuples(FILES, st.integers(0, 5)), max_size=30).map(
    lambda pairs: list(dict.fromkeys(f"{f}::test_{n}" for f, n in pairs)))
TIMES = st.dictionaries(FILES, st.floats(min_value=0, max_value=1e4))


@given(NODEIDS, TIMES, st.sets(FILES))
def test_files_run_longest_first_and_whole_with_their_tests_in_order(nodeids: list[str], times: dict[str, float],
                                                                     slow: set[str]) -> None:
    order = [nodeids[i] for i in ordered(nodeids, times, slow)]
    assert sorted(order) == sorted(nodeids)  # nothing lost, nothing twice
    files = [file_of(n) for n in order]
    runs = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    assert len(runs) == len(set(runs))  # each file's tests together
    weights = [weight(f, times, f in slow) for f in runs]
    assert weights == sorted(weights, reverse=True)
    for name in runs:  # within a file, collection order
        assert [n for n in order if file_of(n) == name] == [n for n in nodeids if file_of(n) == name]


def test_a_file_measured_on_neither_list_counts_by_its_marker() -> None:
    assert weight("tests/new.py", {}, slow=True) == UNKNOWN_SLOW_S
    assert weight("tests/new.py", {}, slow=False) == 0.0
    assert weight("tests/new.py", {"tests/new.py": 3.0}, slow=True) == 3.0


def test_a_run_collects_the_files_its_cache_measured_longest_first(tmp_path: Path) -> None:
    """As pytest collects (and xdist then hands out) a real run's tests: by the last run's times on this machine."""
    (tmp_path / "conftest.py").write_text("from tests.file_order import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_many_quick.py").write_text("".join(f"def test_q{i}():\n    pass\n" for i in range(5)))
    (tmp_path / "test_one_long.py").write_text("def test_long():\n    pass\n")
    (tmp_path / "test_medium.py").write_text("def test_m1():\n    pass\ndef test_m2():\n    pass\n")
    cached = tmp_path / "cache" / "v" / CACHE_KEY
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"test_one_long.py": 120.0, "test_medium.py": 10.0, "test_many_quick.py": 1.0}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", f"cache_dir={tmp_path / 'cache'}",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected == ["test_one_long.py::test_long", "test_medium.py::test_m1", "test_medium.py::test_m2",
                         *(f"test_many_quick.py::test_q{i}" for i in range(5))]
