"""``python -m bench.job_uid_kill``: how long ending an attempt takes under a job uid, from the kill to no
process of the uid left (worker/sandbox/processes.end_identity), as root.

Each round starts, as one uid, a tree that hides from a mark-based kill: ``--procs`` detached sleepers
(``setsid env -i sleep``) plus a fork loop that keeps making new processes while the kill runs. Measured
with the attempt's own cgroup (``cgroup.kill``, where cgroup v2 is writable) and by uid alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from worker.sandbox import cgroups, processes
from worker.sandbox.job_users import JobIdentity, uid_processes

log = logging.getLogger("bench.job_uid_kill")

UID = 29990
# Detached sleepers, then a shell that forks forever (each child forks again before dying).
TREE = "for i in $(seq {n}); do setsid env -i sleep 300 & done; f() {{ (sleep 300 &); f & }}; f & wait"


def one_round(run: Path, procs: int, use_cgroup: bool) -> tuple[float, int]:
    cgroup = cgroups.create("bench", "kill", os.getpid()) if use_cgroup else None
    identity = JobIdentity(UID, cgroup)
    processes.spawn(["sh", "-c", TREE.format(n=procs)], {"PATH": os.defpath}, run, run / "launcher.log", identity=identity)
    deadline = time.monotonic() + 20
    while len(uid_processes(UID)) < procs and time.monotonic() < deadline:
        time.sleep(0.02)
    alive = len(uid_processes(UID))
    took = processes.end_identity(identity)
    assert not uid_processes(UID), "processes survived"
    return took, alive


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.job_uid_kill", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--procs", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(message)s")
    if os.geteuid() != 0:
        sys.exit("needs root (or CAP_SETUID, CAP_SETGID, CAP_KILL)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        os.chown(run, UID, UID)
        modes = [("cgroup+uid", True), ("uid only", False)] if cgroups.worker_root("bench") else [("uid only", False)]
        for name, use_cgroup in modes:
            rounds = [one_round(run, args.procs, use_cgroup) for _ in range(args.rounds)]
            times = [t * 1000 for t, _ in rounds]
            results[name] = {"median_ms": statistics.median(times), "max_ms": max(times),
                             "processes_at_kill": statistics.median(n for _, n in rounds)}
            log.info("%-10s kill -> none left: median %.1f ms, max %.1f ms (%d processes at the kill, fork loop running)",
                     name, results[name]["median_ms"], results[name]["max_ms"], results[name]["processes_at_kill"])
    out = Path(__file__).parent / "results" / "job-uid-kill.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
