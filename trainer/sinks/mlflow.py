"""Rank 0's params, metrics and final weights in an MLflow run, sent in batches from the sink thread."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.sinks.base import Point

log = logging.getLogger(__name__)

# MLflow's log_batch limits: 1000 metrics and 100 params per request; param values up to 6000 characters.
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100
_PARAM_VALUE_MAX = 6000


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
    """One MLflow run per attempt of rank 0, named after the job, tagged with its id and labels."""

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
        found = self._client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else self._client.create_experiment(self.experiment)
        tags = {f"label.{k}": str(v) for k, v in (self.spec.get("labels") or {}).items()}
        if self.job_id:
            tags["torchyard.job_id"] = self.job_id
        run = self._client.create_run(experiment_id, run_name=str(self.spec.get("name") or self.job_id or "torchyard"), tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in flatten(self.spec).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[i:i + _PARAMS_PER_BATCH])
        log.info("logging to MLflow run %s (experiment %r) at %s", self.run_id, self.experiment, self.tracking_uri)

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
