"""bench/suite_cpu.py's reading of a process tree: which kind each process is, and the table by kind."""

from __future__ import annotations

import pytest

from bench.suite_cpu import API, LAUNCHER, PIP, PYTEST, PYTHON, RANK, WORKER, Seen, by_kind, kind_of

PY = "/work/.venv/bin/python"


@pytest.mark.parametrize(("argv", "parent", "kind"), [
    ([PY, "-m", "pytest", "-n", "3"], None, PYTEST),
    ([PY, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"], PYTEST, PYTEST),  # an xdist process
    ([PY, "-m", "tests.service_forks", "17"], PYTEST, API),
    ([PY, "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"], API, API),  # a fork of the server: its cmdline
    ([PY, "-m", "worker", "--name", "node-a"], PYTEST, WORKER),
    ([PY, "-m", "worker", "--name", "node-a"], WORKER, WORKER),  # an RQ work-horse
    ([PY, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "trainer"], WORKER, LAUNCHER),
    (["/usr/local/bin/torchrun", "--standalone", "train.py"], None, LAUNCHER),  # under Slurm: no parent seen
    ([PY, "-u", "-m", "trainer", "--spec", "s.json"], LAUNCHER, RANK),
    (["/tmp/venv/bin/python", "-u", "train.py"], LAUNCHER, RANK),
    ([PY, "-m", "pip", "install", "-r", "requirements.txt"], PYTEST, PIP),
    (["/usr/local/bin/pip", "install", "x"], PYTEST, PIP),
    ([PY, "-c", "import torch"], PYTEST, PYTHON),
    (["redis-server", "127.0.0.1:6379"], PYTEST, "redis-server"),
])
def test_each_process_is_named_by_its_command_line_and_its_parent(argv: list[str], parent: str | None, kind: str) -> None:
    assert kind_of(argv, parent) == kind


def test_the_table_adds_up_by_kind_and_folds_small_programs() -> None:
    seen = [Seen(RANK, 3.5), Seen(RANK, 4.5), Seen(LAUNCHER, 2.0), Seen("redis-server", 1.0), Seen("sbatch", 0.5),
            Seen("slurmd", 12.0)]
    table = by_kind(seen)
    assert list(table) == ["slurmd", RANK, LAUNCHER, "other programs"]  # most CPU first
    assert table[RANK] == {"processes": 2, "cpu_s": 8.0}
    assert table["other programs"] == {"processes": 2, "cpu_s": 1.5}
    assert sum(row["cpu_s"] for row in table.values()) == sum(s.cpu_s for s in seen)
