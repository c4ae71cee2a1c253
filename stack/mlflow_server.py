"""A private ``mlflow server`` (SQLite backend, artifacts proxied) on a free port: what the tracking benchmark
and the MLflow tests send to. Needs the full ``mlflow`` package (the dev extra); the workers only need
``mlflow-skinny``."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from stack.redis_server import free_port


def mlflow_command() -> Path | None:
    """The ``mlflow`` command beside this interpreter, if the mlflow package is installed."""
    command = Path(sys.executable).with_name("mlflow")
    return command if importlib.util.find_spec("mlflow") is not None and command.exists() else None


@contextlib.contextmanager
def mlflow_server(work: Path, timeout_s: float = 180) -> Iterator[str]:
    """Start the server with its database, artifacts and log (``mlflow.log``) under ``work``; yields its URL."""
    command = mlflow_command()
    if command is None:
        raise RuntimeError("mlflow is not installed (pip install -e '.[test]' installs it)")
    port = free_port()
    log_path = work / "mlflow.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen([str(command), "server", "--host", "127.0.0.1", "--port", str(port),
                                 "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
                                 "--artifacts-destination", str(work / "mlartifacts"), "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"mlflow server exited {proc.returncode}: {log_path.read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not answer within {timeout_s:.0f} s")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
