"""Executors: where an attempt's ranks run (base.py has the contract). ``TORCHYARD_EXECUTOR`` picks one."""

from __future__ import annotations

from jobs.settings import Settings
from worker.executors.base import Executor
from worker.executors.local import LocalExecutor
from worker.executors.slurm import SlurmExecutor


def make_executor(settings: Settings) -> Executor:
    if settings.executor == "slurm":
        return SlurmExecutor(settings)
    return LocalExecutor(settings)
