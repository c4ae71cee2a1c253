"""(7) Your own code: uploading a 50 MiB working directory, and POST -> first step of a script job
with per-job requirements, its environment cached and not, against a real API and worker.

Upload: the directory is packed (canonical tar, torchyard/client/pack.py), sent to ``POST /v1/code`` (gzip-compressed
when a sample of it compresses),
checked and stored; then the same directory is submitted again, which packs it and asks ``HEAD`` only.
Two directories of 50 MiB: random bytes (data or weights, incompressible) and Python-like source text.

First step: a one-rank script that imports its requirement (tomli-w, from the package index) and
reports step 1 through ``torchyard.report``; the time from POST to the job row's ``last_step`` (what
``GET /v1/jobs/{id}`` shows), polled every 20 ms through the API. "Uncached" builds the environment
(venv + pip install) inside that time; "cached" finds it; "none" is the same script without requirements.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.common import TOKEN, Ctx, Stack, database, median
from torchyard.client import Client
from torchyard.client.pack import pack

log = logging.getLogger("bench.code")

MIB = 1024 * 1024
SCRIPT = (
    "import tomli_w\n"
    "from torchyard import report\n"
    "report.metrics(1, {'train/loss': float(len(tomli_w.dumps({'a': 1})))})\n"
)
PLAIN = "from torchyard import report\nreport.metrics(1, {'train/loss': 1.0})\n"
REQUIREMENT = "tomli-w==1.2.0"


def _directory(root: Path, kind: str, total: int) -> Path:
    """``total`` bytes in 1 MiB files (random bytes) or 64 KiB Python-like files (text)."""
    root.mkdir(parents=True)
    size = MIB if kind == "random" else 64 * 1024
    line = b"def f_%06d(x):\n    return x * %d + 1  # some source code\n"
    for i in range(total // size):
        sub = root / f"pkg{i // 100}"
        sub.mkdir(exist_ok=True)
        text = b"".join(line % (j, j) for j in range(i * 2000, i * 2000 + 2000))[:size]
        data = os.urandom(size) if kind == "random" else text
        (sub / f"f{i:04d}.{'bin' if kind == 'random' else 'py'}").write_bytes(data)
    return root


def _upload(client: Client, work: Path, kind: str) -> dict[str, Any]:
    directory = _directory(work / f"dir-{kind}", kind, 50 * MIB)
    t0 = time.perf_counter()
    with pack(directory) as packed:
        pack_s = time.perf_counter() - t0
        sent = sum(len(c) for c in packed.chunks(gzip=packed.compressible()))
        archive = packed.size_bytes
    t0 = time.perf_counter()
    bundle = client.upload_code(directory)  # packs again, HEAD (404), POST
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = client.upload_code(directory)  # packs, HEAD (200): nothing sent
    again_s = time.perf_counter() - t0
    assert bundle.uploaded and not again.uploaded and bundle.digest == again.digest
    shutil.rmtree(directory)
    return {"archive_bytes": archive, "sent_bytes": sent, "files": bundle.files, "pack_s": pack_s,
            "first_submit_upload_s": first_s, "unchanged_again_s": again_s}


def _first_step(client: Client, code: str, requirements: list[str], name: str) -> float:
    spec = {"kind": "script", "name": name, "entrypoint": "main.py", "code": code, "requirements": requirements,
            "parallel": {"nproc_per_node": 1}}
    posted = time.perf_counter()
    job = client.submit(spec)
    deadline = time.monotonic() + 600
    while True:
        current = client.job(job.id)
        if current.last_step is not None:
            took = time.perf_counter() - posted
            client.wait(job.id, timeout=300, poll_interval=0.2)
            return took
        if current.terminal or time.monotonic() > deadline:
            raise RuntimeError(f"job {job.id} ended {current.status} without a step: {current.error}")
        time.sleep(0.02)


def code(ctx: Ctx) -> dict[str, Any]:
    rounds = 1 if ctx.quick else 3
    with database("sqlite", ctx.work) as url, Stack(ctx.work / "code-stack", url, poll_interval_s=0.2) as stack:
        venvs = stack.settings.venvs_root
        with Client(stack.url, TOKEN, timeout=600) as client:
            upload = {kind: _upload(client, ctx.work, kind) for kind in ("random", "text")}
            for name, text in (("with", SCRIPT), ("plain", PLAIN)):
                d = ctx.work / f"script-{name}"
                d.mkdir()
                (d / "main.py").write_text(text)
            with_dep = client.upload_code(ctx.work / "script-with").digest
            plain = client.upload_code(ctx.work / "script-plain").digest
            times: dict[str, list[float]] = {"uncached": [], "cached": [], "none": []}
            for i in range(rounds):
                shutil.rmtree(venvs, ignore_errors=True)  # no job runs now: a cold cache
                times["uncached"].append(_first_step(client, with_dep, [REQUIREMENT], f"uncached-{i}"))
                times["cached"].append(_first_step(client, with_dep, [REQUIREMENT], f"cached-{i}"))
                times["none"].append(_first_step(client, plain, [], f"none-{i}"))
    summary = {k: {"median": median(v), "all": v} for k, v in times.items()}
    log.info("upload %s; first step %s", upload, {k: round(v["median"], 2) for k, v in summary.items()})
    return {"config": {"rounds": rounds, "requirement": REQUIREMENT, "poll_interval_s": 0.2}, "upload": upload,
            "post_to_first_step_s": summary}
