"""HTTP load with ``wrk`` (Debian package ``wrk``, installed here when missing): a C load generator that,
unlike a Python one, does not take the two cores the server needs."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.wrk")
SCRIPT = Path(__file__).resolve().parent / "wrk" / "request.lua"


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    log.info("wrk is missing; installing the Debian package")
    subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=True, capture_output=True, timeout=600)
    found = shutil.which("wrk")
    if not found:
        raise RuntimeError("wrk is not installed and apt-get could not install it")
    return found


def run(base_url: str, *, method: str, path: str, token: str, connections: int, duration_s: float,
        ids_file: Path | None = None, body_file: Path | None = None) -> dict[str, Any]:
    """Requests/s and p50/p99 latency of ``method path`` (``%s`` in ``path`` takes the ids in turn)."""
    env = {**os.environ, "WRK_METHOD": method, "WRK_PATH": path, "WRK_TOKEN": token}
    if ids_file:
        env["WRK_IDS"] = str(ids_file)
    if body_file:
        env["WRK_BODY"] = str(body_file)
    cmd = [ensure_wrk(), "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s", "--timeout", "10s", "-s", str(SCRIPT), base_url]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 60)
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRKJSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-1000:]}")
    raw = json.loads(line.removeprefix("WRKJSON "))
    seconds = raw["duration_us"] / 1e6
    return {"rps": raw["requests"] / seconds, "p50_ms": raw["p50_us"] / 1000, "p99_ms": raw["p99_us"] / 1000,
            "requests": raw["requests"], "non2xx": raw["non2xx"], "socket_errors": raw["socket_errors"]}
