"""(8) What the TensorBoard and MLflow sinks cost training, side by side in one launch (bench/tracking_cost.py),
against a real MLflow tracking server (SQLite backend) started here."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import Ctx, bench_env, run_logged, torchrun
from stack.redis_server import free_port

log = logging.getLogger(__name__)


@contextlib.contextmanager
def mlflow_server(work: Path) -> Iterator[str | None]:
    """A local ``mlflow server`` (SQLite, artifacts proxied); None when mlflow is not installed."""
    if importlib.util.find_spec("mlflow") is None:
        log.warning("tracking: mlflow is not installed (pip install -e '.[dev]'); the MLflow mode is left out")
        yield None
        return
    port = free_port()
    with (work / "mlflow.log").open("wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
                                 "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
                                 "--artifacts-destination", str(work / "mlartifacts"), "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"mlflow server exited {proc.returncode}; see {work / 'mlflow.log'}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("mlflow server did not answer within 180 s")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def tracking(ctx: Ctx) -> dict[str, Any]:
    """(8) Step time with events.jsonl only, plus TensorBoard, plus MLflow, at the default log cadence."""
    out = ctx.work / "tracking-cost.json"
    cycles = 20 if ctx.quick else 40
    with mlflow_server(ctx.work) as uri:
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
