"""Runs several training jobs in one process group, to pay torchrun and torch start-up once.

Usage (under torchrun or by hand): ``python tests/trainer/run_cases.py CASES.json``, where CASES.json
is a list of {"spec": {...}, "run_dir": "...", "resume_from": optional checkpoint dir copied into
run_dir/checkpoints first (as if the run had stopped there)}. Writes each case's exit code to
run_dir/exit_code.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import torch.distributed as dist

from jobspec.exit_codes import exit_now
from jobspec.spec import parse_spec
from trainer import distributed, loop


def main(cases_file: str) -> int:
    logging.basicConfig(level=logging.WARNING)
    cases = json.loads(Path(cases_file).read_text())
    rank = distributed.init_distributed("cpu")
    for case in cases:
        run_dir = Path(case["run_dir"])
        if rank.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            if case.get("resume_from"):
                src = Path(case["resume_from"])
                (run_dir / "checkpoints").mkdir(exist_ok=True)
                shutil.copytree(src, run_dir / "checkpoints" / src.name)
                (run_dir / "checkpoints" / "latest").write_text(src.name)
        dist.barrier()
        code = loop.run(parse_spec(case["spec"]), run_dir, rank, None)
        if rank.is_main:
            (run_dir / "exit_code").write_text(str(code))
    # As the trainer ends (trainer/__main__.py): every rank reaches the barrier before any tears its groups down, and
    # the interpreter's teardown is skipped; a rank that skipped either aborted after its work was done (SIGABRT,
    # "terminate called without an active exception") on a loaded host.
    distributed.shutdown(barrier=True)
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1]))
