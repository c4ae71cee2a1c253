"""Ends a job's MLflow run with its attempt's outcome, which rank 0 cannot do when it is killed.

Rank 0's sink marks the run FINISHED or FAILED when it exits on its own; a SIGKILL, an OOM kill, a lost node
or a cancel leaves the run RUNNING, or FINISHED after a preemption that the job resumes from. The worker
knows how the attempt ended, so it sets the run's status from that; the next attempt, if any, marks the
run RUNNING again (torchyard/sinks/mlflow.py). Bounded: a tracking server that does not answer delays the
worker by at most ``TIMEOUT_S`` and is otherwise only logged, never a reason to fail the job.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from torchyard.sinks.mlflow import recorded_run_id

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
# Attempt outcome (jobs.store.models.Attempt.outcome) -> MLflow run status.
_STATUS = {"succeeded": "FINISHED", "failed": "FAILED"}  # cancelled, preempted, lost: KILLED


def preload() -> None:
    """Import MLflow's client in the worker, before any task is forked: each task's settle is then a couple of
    HTTP calls, where importing it there (1.4 s on an idle 2-core machine, longer beside training ranks) could
    use up ``TIMEOUT_S`` and leave a failed job's run RUNNING."""
    try:
        import mlflow.tracking  # noqa: F401
    except ImportError:
        log.warning("TORCHYARD_MLFLOW_TRACKING_URI is set but mlflow is not installed in the worker: the MLflow "
                    "run of a killed rank keeps the status it had")


def settle(run_dir: Path, outcome: str, tracking_uri: str | None) -> None:
    """Give the job's MLflow run (if it has one) the status of this attempt's ``outcome``."""
    run_id = recorded_run_id(run_dir) if tracking_uri else None
    if run_id is None:
        return
    status = _STATUS.get(outcome, "KILLED")

    def end() -> None:
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=tracking_uri)
            if client.get_run(run_id).info.status != status:
                client.set_terminated(run_id, status)
                log.info("MLflow run %s marked %s (attempt %s)", run_id, status, outcome)
        except Exception as exc:  # noqa: BLE001 - the tracking server's trouble is never the job's
            log.warning("could not mark MLflow run %s %s: %s", run_id, status, exc)

    thread = threading.Thread(target=end, name="mlflow-settle", daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    if thread.is_alive():
        log.warning("MLflow run %s: the tracking server did not answer in %.0f s; left as it is", run_id, TIMEOUT_S)
