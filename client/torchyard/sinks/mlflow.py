"""Rank 0's params, metrics and final weights in an MLflow run, sent in batches from the sink thread."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchyard.atomic import write_atomic
from torchyard.sinks.base import Point

log = logging.getLogger(__name__)

# MLflow's log_batch limits: 1000 metrics and 100 params per request; param values up to 6000 characters.
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100
_PARAM_VALUE_MAX = 6000
# The job's MLflow run id, in its run directory: every attempt and resume logs to the one run, and the
# worker ends a run whose rank 0 died before it could (worker/mlflow_runs.py).
RUN_ID_FILE = "mlflow_run_id"


def recorded_run_id(run_dir: Path) -> str | None:
    """The MLflow run a job's attempts log to, if one was opened."""
    try:
        return (run_dir / RUN_ID_FILE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def flatten(spec: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": "0.1"}``: the spec as MLflow params (env and labels left out:
    env is the job's business, labels become tags)."""
    out: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if not prefix and key in ("env", "labels", "secrets"):
            continue
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:_PARAM_VALUE_MAX]
    return out


class MlflowSink:
    """One MLflow run per job, named after it, tagged with its id and labels. A later attempt (a retry, a resume
    after preemption) logs to the same run, marked RUNNING again; its params stay the first attempt's (MLflow
    params cannot change), and steps replayed after the resumed checkpoint appear twice in a metric's history."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str, run_dir: Path, job_id: str | None, spec: Mapping[str, Any]):
        self.tracking_uri, self.experiment, self.run_dir, self.job_id, self.spec = tracking_uri, experiment, run_dir, job_id, spec
        self.run_id: str | None = None
        self.weights: str | None = None  # the newest consolidated weights file reported, relative to the run dir
        self._client: Any = None
        # Imported here, before training, not on the sink thread (see TensorBoardSink); ImportError when the
        # worker image lacks mlflow-skinny, which factory.build reports.
        from mlflow.tracking import MlflowClient

        self._client_class = MlflowClient

    def open(self) -> None:
        from mlflow.entities import Param

        self._client = self._client_class(tracking_uri=self.tracking_uri)
        if self._resume():
            return
        found = self._client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else self._client.create_experiment(self.experiment)
        tags = {f"label.{k}": str(v) for k, v in (self.spec.get("labels") or {}).items()}
        if self.job_id:
            tags["torchyard.job_id"] = self.job_id
        run = self._client.create_run(experiment_id, run_name=str(self.spec.get("name") or self.job_id or "torchyard"), tags=tags)
        self.run_id = run.info.run_id
        # Recorded before anything else is sent: a rank killed from here on leaves a run the worker can end.
        write_atomic(self.run_dir / RUN_ID_FILE, self.run_id)
        params = [Param(k, v) for k, v in flatten(self.spec).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[i:i + _PARAMS_PER_BATCH])
        log.info("logging to MLflow run %s (experiment %r) at %s", self.run_id, self.experiment, self.tracking_uri)

    def _resume(self) -> bool:
        """Continue the run an earlier attempt opened, if the tracking server still has it."""
        from mlflow.exceptions import MlflowException

        run_id = recorded_run_id(self.run_dir)
        if run_id is None:
            return False
        try:
            self._client.get_run(run_id)
        except MlflowException as exc:  # deleted, or another tracking server since
            log.warning("MLflow run %s of an earlier attempt is not found (%s); opening a new one", run_id, exc)
            return False
        self._client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        log.info("continuing MLflow run %s at %s", run_id, self.tracking_uri)
        return True

    def write(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, math.nan if value is None else float(value), now, step)
                   for step, values in points for name, value in values.items()]
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i:i + _METRICS_PER_BATCH])

    def note_weights(self, relative: str) -> None:
        self.weights = relative

    def close(self, failed: bool = False) -> None:
        if self._client is None or self.run_id is None:
            return
        if self.weights and not failed:
            path = self.run_dir / self.weights
            if path.is_file():
                self._client.log_artifact(self.run_id, str(path), artifact_path="weights")
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
