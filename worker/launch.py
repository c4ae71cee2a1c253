"""How a job becomes a torchrun command line and environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jobs.settings import Settings
from trainer.spec import JobSpec
from worker.processes import JOB_MARK

SPEC_FILE = "spec.json"
ERROR_FILE = "error.json"


def torchrun_command(spec: JobSpec, run_dir: Path, attempt: int) -> list[str]:
    """One node's torchrun invocation. ``--standalone`` picks a free port and a fresh
    rendezvous id, so two jobs on one host never join each other's rendezvous."""
    p = spec.parallel
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={p.nproc_per_node}",
        f"--max-restarts={spec.max_restarts}",
        f"--log-dir={run_dir / 'logs' / f'attempt-{attempt}'}",
        "--redirects=3",
        "-m", "trainer",
        "--spec", str(run_dir / SPEC_FILE),
        "--run-dir", str(run_dir),
    ]


def torchrun_env(job_id: str, attempt: int, run_dir: Path, settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        JOB_MARK: job_id,
        "TORCHYARD_ATTEMPT": str(attempt),
        # torchrun copies the root-cause rank's @record traceback here.
        "TORCHELASTIC_ERROR_FILE": str(run_dir / ERROR_FILE),
        "TORCHYARD_DATA_DIR": str(settings.data_dir.resolve()),
        "PYTHONUNBUFFERED": "1",
    })
    return env
