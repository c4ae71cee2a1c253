"""The dashboard's compare view in headless Chromium against a live service: two finished jobs that differ in
their learning rate are ticked in the table and overlaid, their differing spec field in the table below the legend."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.dashboard.test_dashboard import CHROMIUM, playwright_core  # noqa: F401 - the fixture is shared
from tests.helpers import ADMIN_TOKEN, Services
from torchyard.client import Client

pytestmark = pytest.mark.slow

SPEC = {
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 512, "eval_samples": 128, "features": 8, "classes": 4}},
    "parallel": {"nproc_per_node": 1},
    "train": {"epochs": 1, "global_batch_size": 16, "log_every_steps": 4},
    "eval": {"every_steps": 8},
}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_compare_view_overlays_two_jobs(services: Services, playwright_core: Path, tmp_path: Path) -> None:  # noqa: F811
    services.start_api()
    services.start_worker()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with Client(services.url, ADMIN_TOKEN) as client:
        jobs = [client.submit({**SPEC, "name": f"lr-{lr}", "train": {**SPEC["train"], "lr": lr}}) for lr in (0.01, 0.001)]
        done = [client.wait(j.id, timeout=240, poll_interval=0.5) for j in jobs]
        assert [j.status for j in done] == ["succeeded", "succeeded"]
        losses = [len(client.metrics(j.id, "train/loss")) for j in jobs]

    ids = [j.id for j in jobs]
    config = {"url": f"{services.url}/", "key": ADMIN_TOKEN, "jobIds": ids, "chromium": CHROMIUM, "outDir": str(shots)}
    run = subprocess.run(["node", str(Path(__file__).with_name("compare.mjs"))], env={**os.environ, "DRIVE_CONFIG": json.dumps(config)},
                         capture_output=True, text=True, timeout=240)
    lines = run.stdout.strip().splitlines()
    assert lines, f"the browser driver printed nothing (exit {run.returncode}):\n{run.stderr}"
    seen = json.loads(lines[-1])
    assert run.returncode == 0 and "error" not in seen, f"{seen.get('error')}\n{run.stderr}\nscreenshots in {shots}"

    assert seen["buttonDisabledBefore"] is True and seen["buttonDisabledWithOne"] is True
    assert seen["firstStillTicked"] is True and seen["buttonText"] == "Compare (2)"
    assert seen["hash"] == f"#/compare/{ids[0]},{ids[1]}"
    assert seen["loss"] == {"series": 2, "points": sum(losses), "metric": "train/loss"}
    assert seen["eval"]["series"] == 2 and seen["eval"]["metric"] == "eval/accuracy"
    assert seen["throughput"]["series"] == 2 and seen["throughput"]["metric"] == "train/samples_per_s"
    assert [item["id"] for item in seen["legend"]] == ids
    assert seen["legend"][0]["text"].startswith("lr-0.01") and seen["legend"][1]["text"].startswith("lr-0.001")
    # Only the fields that differ: the learning rate (the names show in the legend).
    assert seen["diff"] == [{"field": "train.lr", "cells": ["0.01", "0.001"], "shown": True}]
    assert all(n > 50 for n in seen["linePixels"]), seen["linePixels"]  # both jobs' lines are drawn
    assert seen["problems"] == [], seen["problems"]
    assert (shots / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
