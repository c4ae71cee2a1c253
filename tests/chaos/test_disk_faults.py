"""A full disk while a run is prepared fails the job as disk_full naming the path, once, instead of three lost workers.

The runs volume is a tiny tmpfs the test mounts and fills (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.settings import Settings
from tests.chaos.conftest import spec
from tests.helpers import Services

pytestmark = pytest.mark.slow


@pytest.fixture
def full_runs_volume(settings: Settings) -> Iterator[Path]:
    runs = settings.runs_dir
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(runs)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        fd = os.open(runs / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # full: what the test wants
        finally:
            os.close(fd)
        yield runs
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def test_disk_full_while_preparing_fails_the_job_as_disk_full(services: Services, full_runs_volume: Path) -> None:
    services.start_api()
    services.start_worker()
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec(10, retries=2)).json()["id"]
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=120)
        assert job["status"] == "failed"
        assert job["error"]["type"] == "disk_full"
        assert str(full_runs_volume / job_id) in job["error"]["message"]
        assert job["attempt"] == 1  # neither retried nor taken for a lost worker
