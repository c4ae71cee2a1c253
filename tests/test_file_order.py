"""The longest test files start first: a file's tests stay together and in their written order."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests import file_order
from tests.file_order import load_times, longest_first, record
from tests.quick_examples import examples

FILES = st.sampled_from([f"tests/test_{name}.py" for name in "abcdef"])


@given(files=st.lists(FILES, max_size=40), times=st.dictionaries(FILES, st.floats(0, 500)))
@settings(max_examples=examples(100))
def test_files_run_longest_first_each_whole_and_in_order(files: list[str], times: dict[str, float]) -> None:
    items = [(name, index) for index, name in enumerate(files)]  # (file, position in the file's collection)
    ordered = longest_first(items, lambda item: item[0], lambda name: times.get(name, 1.0))
    assert sorted(ordered) == sorted(items)  # nothing lost or doubled
    runs = [name for index, (name, _) in enumerate(ordered) if index == 0 or ordered[index - 1][0] != name]
    assert len(runs) == len(set(runs))  # each file's items together
    assert [times.get(name, 1.0) for name in runs] == sorted((times.get(name, 1.0) for name in runs), reverse=True)
    for name in runs:  # a file's tests in the order they were collected
        positions = [index for file, index in ordered if file == name]
        assert positions == sorted(positions)


def test_a_recorded_run_updates_its_files_and_keeps_the_others(tmp_path: Path) -> None:
    table = tmp_path / "file_times.json"
    assert load_times(table) == {}
    record({"tests/a.py": 12.345, "tests/b.py": 3.0}, table)
    record({"tests/b.py": 7.0}, table)
    assert load_times(table) == {"tests/a.py": 12.3, "tests/b.py": 7.0}
    table.write_text("not json")
    assert load_times(table) == {}  # a broken table orders by marks alone; the run goes on


def test_the_committed_table_names_test_files_that_exist() -> None:
    times = load_times(file_order.TIMES_FILE)
    assert times, "tests/file_times.json is missing or empty"
    root = Path(file_order.__file__).parent.parent
    gone = [name for name in times if not (root / name).is_file()]
    assert gone == [], f"{gone}: rerun with --record-file-times, or remove them"
