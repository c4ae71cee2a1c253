"""(8) What the TensorBoard and MLflow sinks cost training, side by side in one launch (bench/tracking_cost.py),
against a real MLflow tracking server (SQLite backend) started here."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import Ctx, bench_env, run_logged, torchrun
from stack.mlflow_server import mlflow_command, mlflow_server

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _tracking_server(work: Path) -> Iterator[str | None]:
    """The local MLflow server; None when mlflow is not installed (the MLflow mode is then left out)."""
    if mlflow_command() is None:
        log.warning("tracking: mlflow is not installed (pip install -e '.[test]'); the MLflow mode is left out")
        yield None
        return
    with mlflow_server(work) as url:
        yield url


def tracking(ctx: Ctx) -> dict[str, Any]:
    """(8) Step time with events.jsonl only, plus TensorBoard, plus MLflow, at the default log cadence."""
    out = ctx.work / "tracking-cost.json"
    cycles = 20 if ctx.quick else 40
    with _tracking_server(ctx.work) as uri:
        cmd = torchrun(2, "-m", "bench.tracking_cost", "--out", str(out), "--cycles", str(cycles),
                       *(["--mlflow-uri", uri] if uri else []))
        run_logged(cmd, ctx.work / "tracking-cost.log", bench_env(), timeout_s=600)
    result = json.loads(out.read_text())
    step_s = result["step_s"]
    base = step_s["jsonl"]
    ratios = {f"{m}/jsonl samples_per_s": base / v for m, v in step_s.items() if m != "jsonl"}
    log.info("tracking: step %s ms", {m: round(v * 1e3, 3) for m, v in step_s.items()})
    return {"config": {"model": "mlp hidden 256 x 2, DDP, 2 ranks, global batch 64", "block_steps": result["block_steps"],
                       "cycles": cycles, "log_every_steps": result["every"]},
            "step_ms": {m: v * 1e3 for m, v in step_s.items()}, "ratios": ratios, "sinks": result["sinks"]}
