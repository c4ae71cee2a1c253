"""Which sinks a job's rank 0 gets: TensorBoard always, MLflow when the operator configured a tracking server."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from torchyard.sinks.base import Sink, SinkRunner

log = logging.getLogger(__name__)

# Set for every rank by the worker from TORCHYARD_MLFLOW_TRACKING_URI (an operator setting, never a job's env).
MLFLOW_URI_ENV = "TORCHYARD_MLFLOW_TRACKING_URI"
JOB_ID_ENV = "TORCHYARD_JOB_ID"
SPEC_FILE = "spec.json"


def _spec(run_dir: Path) -> dict[str, Any]:
    try:
        spec = json.loads((run_dir / SPEC_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # a script run by hand with TORCHYARD_RUN_DIR set and no spec.json
    return spec if isinstance(spec, dict) else {}


def build(run_dir: Path, spec: dict[str, Any] | None = None) -> SinkRunner:
    """The sinks of the job in ``run_dir`` (its ``spec.json`` unless ``spec`` is given), started on their thread."""
    spec = _spec(run_dir) if spec is None else spec
    sinks: list[Sink] = []
    from torchyard.sinks.tensorboard import TensorBoardSink

    try:
        sinks.append(TensorBoardSink(run_dir))
    except ImportError as exc:  # a script's own environment without the tensorboard package
        log.warning("tensorboard is not importable here (%s); no TensorBoard event file is written", exc)
    uri = os.environ.get(MLFLOW_URI_ENV)
    wanted = (spec.get("tracking") or {}).get("mlflow")
    if uri:
        from torchyard.sinks.mlflow import MlflowSink

        experiment = (wanted or {}).get("experiment") or "torchyard"
        try:
            sinks.append(MlflowSink(uri, experiment, run_dir, os.environ.get(JOB_ID_ENV), spec))
        except ImportError as exc:
            log.warning("MLflow tracking is configured but mlflow is not importable here (%s); nothing is sent to MLflow", exc)
    elif wanted:
        log.warning("tracking.mlflow is set but this service has no MLflow tracking server (TORCHYARD_MLFLOW_TRACKING_URI); "
                    "nothing is sent to MLflow")
    return SinkRunner(sinks)
