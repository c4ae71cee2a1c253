"""The framework's ceiling: a bare FastAPI app answering ``GET /v1/jobs/{id}`` and ``POST /v1/jobs`` with a
fixed body of the size torchyard's answer has (``BARE_BODY``, a file), served by uvicorn in one process
with the same options as ``python -m api``. bench/read_path.py measures torchyard against it side by side.

    BARE_BODY=body.json python -m bench.bare_app --port 8001
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Response

BODY = Path(os.environ["BARE_BODY"]).read_bytes() if os.environ.get("BARE_BODY") else b"{}"
app = FastAPI()


@app.get("/v1/jobs/{job_id}")
def get_job(job_id: str) -> Response:
    return Response(BODY, media_type="application/json")


@app.post("/v1/jobs", status_code=201)
def post_job(spec: dict[str, Any]) -> Response:
    # The body is parsed, as torchyard's is, before the fixed answer.
    return Response(BODY, status_code=201, media_type="application/json")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bare_app")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_config=None, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
