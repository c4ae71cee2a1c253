"""(13) Object storage: a checkpoint of about 1 GiB up to an S3-compatible store and back down, by the worker's own
code (jobs/storage/checkpoints.py: upload once complete, manifest last; a resume's verified download) against
boto3's own transfer manager copying the same files with its defaults, side by side in one run, against a real
SeaweedFS S3 gateway on this machine (stack/seaweed_server.py).

The checkpoint is laid out as torch.distributed.checkpoint writes one for two ranks: one shard file per rank and
a small ``.metadata``. Random bytes, so nothing compresses. Rounds alternate the two clients so drift in the
machine's load falls on both.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.common import Ctx, median
from jobs.storage.checkpoints import download_checkpoint, job_key, newest_stored, upload_checkpoint
from jobs.storage.store import ObjectStore
from jobs.storage.url import parse
from stack.seaweed_server import SeaweedServer

log = logging.getLogger("bench.object_store")

MIB = 1024 * 1024
ACCESS, SECRET = "bench-access", "bench-secret-not-a-real-one"


def _checkpoint(root: Path, shard_mib: int) -> Path:
    """``checkpoints/step_00001000`` with two shards of ``shard_mib`` MiB and a metadata file."""
    local = root / "checkpoints" / "step_00001000"
    local.mkdir(parents=True)
    for rank in range(2):
        with (local / f"__{rank}_0.distcp").open("wb") as f:
            for _ in range(shard_mib):
                f.write(os.urandom(MIB))
    (local / ".metadata").write_bytes(os.urandom(64 * 1024))
    return local


def _boto3_upload(store: ObjectStore, local: Path, prefix: str) -> None:
    for path in sorted(local.iterdir()):
        store.client.upload_file(str(path), store.url.bucket, store.url.key(f"{prefix}/{path.name}"))


def _boto3_download(store: ObjectStore, prefix: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    for key in store.list(prefix):
        store.client.download_file(store.url.bucket, store.url.key(f"{prefix}/{key}"), str(dest / key))


def _timed(fn: Any, *args: Any) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def object_store(ctx: Ctx) -> dict[str, Any]:
    shard_mib, rounds = (64, 2) if ctx.quick else (512, 3)
    work = ctx.work / "object_store"
    server = SeaweedServer(work / "server", ACCESS, SECRET, "bench", volumes=100).start()
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        store = ObjectStore(parse("s3://bench/runs"), server.endpoint)
        local = _checkpoint(work / "run", shard_mib)
        size = sum(p.stat().st_size for p in local.iterdir())
        times: dict[str, list[float]] = {k: [] for k in ("torchyard_up", "boto3_up", "torchyard_down", "boto3_down")}
        for i in range(rounds):
            job = f"job{i}"
            order = ("torchyard", "boto3") if i % 2 == 0 else ("boto3", "torchyard")
            for who in order:
                if who == "torchyard":
                    times["torchyard_up"].append(_timed(upload_checkpoint, store, job, local))
                else:
                    times["boto3_up"].append(_timed(_boto3_upload, store, local, f"plain/{job}"))
            for who in order:
                dest = work / f"down-{who}-{i}"
                if who == "torchyard":
                    manifest = newest_stored(store, job)
                    assert manifest is not None
                    dest.mkdir()
                    times["torchyard_down"].append(_timed(download_checkpoint, store, job, manifest, dest))
                else:
                    times["boto3_down"].append(_timed(_boto3_download, store, f"plain/{job}", dest))
                shutil.rmtree(dest)
            store.delete_prefix(job_key(job))
            store.delete_prefix(f"plain/{job}")
        summary = {k: {"median_s": median(v), "mib_per_s": size / MIB / median(v), "runs_s": v} for k, v in times.items()}
        ratios = {"upload torchyard/boto3": summary["boto3_up"]["median_s"] / summary["torchyard_up"]["median_s"],
                  "download torchyard/boto3": summary["boto3_down"]["median_s"] / summary["torchyard_down"]["median_s"]}
        return {"config": {"checkpoint_mib": round(size / MIB, 1), "files": 3, "rounds": rounds,
                           "server": "SeaweedFS 4.48 S3 gateway, loopback"},
                "summary": summary, "ratios": ratios}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
