"""bench/suite_cpu.py's reading of a process tree: which kind each process is, and the table by kind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.suite_cpu import API, LAUNCHER, MARK, PIP, PYTEST, PYTHON, RANK, WORKER, Sampler, Seen, by_kind, kind_of

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
    ([PY, "-m", "torch.distributed.run", "--run-path", "--start-method=fork", "/t/trainer/__main__.py"], LAUNCHER, RANK),
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


def test_the_sampler_counts_a_process_tree_by_ancestry_and_by_mark_and_nothing_else() -> None:
    """A parent that busies itself, its child, and an unrelated process that carries the run's mark (what Slurm
    starts for a job is no descendant of pytest): all three counted, with their CPU; a process of neither not."""
    # Some CPU, then alive for a few of the sampler's intervals (0.5 s), however slowly a busy machine runs it.
    busy = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\ntime.sleep(1.5)\n"
    tree = busy + f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {busy!r}], check=True)\n"
    marked_env = {**os.environ, MARK: "run-1"}
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        root = subprocess.Popen([sys.executable, "-c", tree], env={k: v for k, v in os.environ.items() if k != MARK})
        with Sampler(root.pid, "run-1") as sampler:
            marked = subprocess.Popen([sys.executable, "-c", busy], env=marked_env)
            assert root.wait(60) == 0 and marked.wait(60) == 0
    finally:
        stranger.kill()
        stranger.wait()
    pids = {pid for pid, _ in sampler.seen}
    assert root.pid in pids and marked.pid in pids and stranger.pid not in pids
    assert len(sampler.seen) == 3, sampler.seen  # the root, its child, the marked process
    # Each was sampled after its 0.2 CPU-s (it slept 1.5 s after them).
    assert all(seen.cpu_s >= 0.1 for seen in sampler.seen.values()), sampler.seen
