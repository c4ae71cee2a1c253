"""The dashboard in headless Chromium (Debian's, driven by playwright-core) against a live service:
sign in, see the jobs table, open a running job, watch its loss chart draw points as they stream
in, cancel it with the button, and retry it with the other. Screenshots are saved under the test's tmp dir; with
TORCHYARD_UPDATE_SCREENSHOT=1 the job page is also copied to docs/img/dashboard.png for the README."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ADMIN_TOKEN, ROOT, Services, wait_until
from torchyard.client import Client

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("TORCHYARD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
DASHBOARD = ROOT / "dashboard"
README_SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"

# Long enough to be running while the browser watches it, cancelled by the test.
SPEC = {
    "name": "mlp-dashboard",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 4096, "eval_samples": 256, "features": 8, "classes": 4,
                                                          "noise": 0.5}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 100_000, "max_steps": 200_000, "global_batch_size": 32, "lr": 0.002, "log_every_steps": 25},
    "eval": {"every_steps": 250},
    "checkpoint": {"every_steps": 1000, "keep_last": 3},
}
UPDATE_SCREENSHOT = os.environ.get("TORCHYARD_UPDATE_SCREENSHOT") == "1"
if UPDATE_SCREENSHOT:
    # For the README: a job whose progress bar, curves and checkpoints show, caught about a third of the way.
    SPEC["train"] = {**SPEC["train"], "max_steps": 6000}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture(scope="module")
def playwright_core() -> Path:
    if not CHROMIUM:
        pytest.skip("no Chromium on PATH: apt-get install chromium (the dashboard test drives the system browser)")
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {' or '.join(missing)} on PATH: `make install-browser` installs Chromium, Node.js and npm")
    module = DASHBOARD / "node_modules" / "playwright-core"
    if not module.is_dir():
        # The lock pins playwright-core; it never downloads a browser of its own.
        env = {**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=DASHBOARD, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"npm ci in dashboard/ failed:\n{done.stdout}\n{done.stderr}"
    return module


def test_jobs_page_live_chart_and_cancel_button(services: Services, playwright_core: Path, tmp_path: Path) -> None:
    services.start_api()
    services.start_worker()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with Client(services.url, ADMIN_TOKEN) as client:
        job = client.submit(SPEC)
        wait_until(lambda: client.job(job.id).status == "running", 60, what="the job to start")

        config = {"url": f"{services.url}/", "key": ADMIN_TOKEN, "jobId": job.id, "chromium": CHROMIUM, "outDir": str(shots),
                  "screenshotAfterPoints": 80 if UPDATE_SCREENSHOT else 0}
        run = subprocess.run(["node", str(Path(__file__).with_name("drive.mjs"))], env={**os.environ, "DRIVE_CONFIG": json.dumps(config)},
                             capture_output=True, text=True, timeout=240)
        lines = run.stdout.strip().splitlines()
        assert lines, f"the browser driver printed nothing (exit {run.returncode}):\n{run.stderr}"
        seen = json.loads(lines[-1])
        assert run.returncode == 0 and "error" not in seen, f"{seen.get('error')}\n{run.stderr}\nscreenshots in {shots}"

        assert seen["badKeyMessage"] == "The API refused this key."
        assert seen["rowStatus"] == "running" and seen["rowCount"] == 1
        assert seen["pointsFirst"] >= 2 and seen["pointsLater"] > seen["pointsFirst"]  # points arrived while we watched
        assert seen["throughputPoints"] > 0
        assert seen["linePixels"] > 100  # the train/loss line is drawn on the canvas
        assert seen["jobStatusBeforeCancel"] == "running"
        assert seen["finalStatus"] == "cancelled" and seen["cancelDisabled"] is True
        assert client.job(job.id).status == "cancelled"
        retried = client.job(seen["retriedJobId"])  # the Retry button made a new job of the same spec
        assert retried.id != job.id and retried.name == SPEC["name"] and seen["retriedStatus"] in ("queued", "running")
        assert seen["rowCountAfter"] == 2
        client.cancel(retried.id)
        client.wait(retried.id, timeout=90, poll_interval=0.5)

    # Expected: the wrong key's 401, and 404s for a rank log that the job has not written yet.
    # Anything else (a console error, a failed asset, a refused call) is a bug of the page.
    expected = re.compile(r"http 401 GET /v1/jobs$|http 404 GET /v1/jobs/\w+/logs$")
    unexpected = [p for p in seen["problems"] if not expected.match(p)]
    assert unexpected == [], seen["problems"]
    for name in ("jobs.png", "dashboard.png", "cancelled.png"):
        assert (shots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    if UPDATE_SCREENSHOT:
        README_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "dashboard.png", README_SCREENSHOT)
