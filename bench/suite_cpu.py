"""Where the test suite's CPU goes, by kind of process: ``python -m bench.suite_cpu [--out DIR] [-- PYTEST ARGS]``.

On the 2-core machines CI runs on, the suite is bound by CPU, so its time is its CPU seconds over two. The slowest-files
table every run prints says which files cost most (tests/slowest_files.py); this says which processes: pytest's own,
the API and workers the tests start, torchrun launchers, their ranks, pip. It runs pytest (by default as
``make test`` does: ``-n 3 --dist loadfile``) and samples every process on the machine twice a second, counting those
pytest started (its descendants, and what Slurm starts for them, which carries this run's mark in its environment).
A process's CPU is its last sample, so the last half second of each and any process shorter than that are missed:
the table shows the sampled total beside what the kernel counted for pytest and its reaped children.

It also times ``import torch`` on this machine, the fixed cost of every launcher and rank, so runs on different
machines compare. Writes bench/results/suite_cpu-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench.common import REPO, Periodic, children_cpu_s, machine

log = logging.getLogger("bench")

MARK = "SUITE_CPU_RUN"  # not TORCHYARD_: the services strip their own prefix from what they pass on
INTERVAL_S = 0.5
DEFAULT_PYTEST_ARGS = ["-n", "3", "--dist", "loadfile"]
BUDGET_CPU_S = 2 * 600  # the suite's goal: 10 minutes on 2 cores
CLK_TCK = os.sysconf("SC_CLK_TCK")

LAUNCHER, RANK, WORKER, API, PYTEST, PIP, PYTHON = (
    "torchrun launchers", "ranks", "workers", "API", "pytest", "pip", "other Python")
XDIST_WORKER = "import sys;exec(eval(sys.stdin.readline()))"


def kind_of(argv: list[str], parent_kind: str | None) -> str:
    """What a process is, from its command line and its parent's kind (as first seen)."""
    program = argv[0].rsplit("/", 1)[-1] if argv else "?"
    if parent_kind == LAUNCHER:
        return RANK  # a catalog job's rank is a fork of its launcher, with the launcher's command line
    if "torch.distributed.run" in argv or program == "torchrun":
        return LAUNCHER
    line = " ".join(argv)
    if "-m worker" in line or (parent_kind == WORKER and program.startswith("python")):
        return WORKER  # an RQ work-horse is a fork of its worker
    if "-m api" in line or "tests.service_forks" in line or parent_kind == API:
        return API  # the tests' APIs are forks of one server per pytest process (tests/service_forks.py)
    if "pytest" in program or "-m pytest" in line or XDIST_WORKER in line:
        return PYTEST  # pytest and its xdist processes, and a pytest a test starts
    if program == "pip" or argv[1:3] == ["-m", "pip"]:
        return PIP
    if program.startswith("python"):
        return PYTHON
    return program[:24]


@dataclass
class Seen:
    kind: str
    cpu_s: float = 0.0


class Sampler(Periodic):
    """Every process of this run: its kind when first seen, its CPU at the last sample."""

    def __init__(self, root: int, mark: str):
        super().__init__(INTERVAL_S)
        self.root, self.mark = root, f"{MARK}={mark}".encode()
        self.seen: dict[tuple[int, int], Seen] = {}  # (pid, start time): pids are reused
        self.ignored: set[tuple[int, int]] = set()
        self._kinds: dict[int, str] = {}  # pid -> kind of the live process with that pid

    def sample(self) -> None:
        stats = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    stats.append((int(fields[19]), int(entry), fields))
        # Oldest first: a parent is looked at before its children, whatever their pids (they wrap).
        for started, pid, fields in sorted(stats):
            self._look(pid, started, fields)

    def _look(self, pid: int, started: int, fields: list[str]) -> None:
        try:
            key = (pid, started)
            cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK
            if key in self.ignored:
                return
            if (seen := self.seen.get(key)) is None:
                ppid = int(fields[1])
                parent_kind = self._kinds.get(ppid)
                if parent_kind is None and pid != self.root and self.mark not in _environ(pid):
                    self.ignored.add(key)
                    return
                argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
                seen = self.seen[key] = Seen(PYTEST if pid == self.root else kind_of(argv, parent_kind))
                self._kinds[pid] = seen.kind
            seen.cpu_s = cpu_s
        except (OSError, IndexError, ValueError):
            return


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def by_kind(seen: list[Seen]) -> dict[str, dict[str, float]]:
    """{kind: {processes, cpu_s}}, the kinds of few CPU seconds folded into "other programs"."""
    cpu: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for s in seen:
        cpu[s.kind] += s.cpu_s
        count[s.kind] += 1
    named = {LAUNCHER, RANK, WORKER, API, PYTEST, PIP, PYTHON}
    table: dict[str, dict[str, float]] = {}
    for kind in sorted(cpu, key=lambda k: -cpu[k]):
        row = "other programs" if kind not in named and cpu[kind] < 10 else kind
        entry = table.setdefault(row, {"processes": 0, "cpu_s": 0.0})
        entry["processes"] += count[kind]
        entry["cpu_s"] += cpu[kind]
    return table


def import_torch_cpu_s(rounds: int = 3) -> float:
    """The median CPU seconds of ``python -c "import torch"`` here: what each launcher and rank pays first."""
    costs = []
    for _ in range(rounds):
        before = children_cpu_s()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        costs.append(children_cpu_s() - before)
    return statistics.median(costs)


def report(table: dict[str, dict[str, float]], kernel_cpu_s: float) -> str:
    sampled = sum(row["cpu_s"] for row in table.values())
    lines = [f"{'kind':<20} {'processes':>9} {'CPU-s':>8} {'each':>6} {'share':>6}"]
    for kind, row in table.items():
        lines.append(f"{kind:<20} {row['processes']:>9.0f} {row['cpu_s']:>8.0f} "
                     f"{row['cpu_s'] / max(row['processes'], 1):>6.2f} {row['cpu_s'] / sampled:>6.0%}")
    torch_s = sum(table.get(k, {}).get("cpu_s", 0.0) for k in (LAUNCHER, RANK))
    lines += [f"{'sampled':<20} {'':>9} {sampled:>8.0f}",
              f"{'kernel (pytest + reaped children)':<36} {kernel_cpu_s:>8.0f}",
              f"launchers and ranks: {torch_s:.0f} CPU-s; ten minutes on two cores is {BUDGET_CPU_S}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where the JSON goes")
    parser.add_argument("pytest_args", nargs="*", help=f"after --: pytest's arguments (default {' '.join(DEFAULT_PYTEST_ARGS)})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pytest_args = args.pytest_args or DEFAULT_PYTEST_ARGS
    host = machine()
    torch_s = import_torch_cpu_s()
    log.info("import torch: %.2f CPU-s here; running pytest %s", torch_s, " ".join(pytest_args))
    env = {**os.environ, MARK: (mark := uuid.uuid4().hex)}
    started = time.monotonic()
    before = children_cpu_s()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args], cwd=REPO, env=env)
    with Sampler(proc.pid, mark) as sampler:
        code = proc.wait()
    kernel_cpu_s = children_cpu_s() - before
    wall_s = time.monotonic() - started
    table = by_kind(list(sampler.seen.values()))
    log.info("pytest exited %d after %.0f s\n%s", code, wall_s, report(table, kernel_cpu_s))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"suite_cpu-{stamp}.json"
    path.write_text(json.dumps({"machine": host, "import_torch_cpu_s": round(torch_s, 2), "pytest_args": pytest_args,
                                "exit_code": code, "wall_s": round(wall_s, 1), "kernel_cpu_s": round(kernel_cpu_s, 1),
                                "kinds": table}, indent=1))
    log.info("wrote %s", path)
    return code


if __name__ == "__main__":
    sys.exit(main())
