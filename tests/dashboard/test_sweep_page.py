"""The dashboard's sweep page in headless Chromium against a live API: an ASHA sweep whose trials the test plays
through (the controller's pass in-process, the jobs' progress written as a supervisor would), then the trials
table, the metric curves with the stopped trials greyed, the parameter scatter, and compare of the top trials."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.api.test_sweep_controller import World, asha_sweep
from tests.dashboard.test_dashboard import CHROMIUM, playwright_core  # noqa: F401 - the fixture is shared
from tests.helpers import ADMIN_TOKEN, Services

pytestmark = pytest.mark.slow


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_sweep_page_shows_trials_curves_and_compares_the_best(services: Services, playwright_core: Path,  # noqa: F811
                                                             tmp_path: Path) -> None:
    services.start_api()
    with httpx.Client(base_url=services.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        sweep_id = client.post("/v1/sweeps", json=asha_sweep()).json()["id"]
        world = World(services.settings)
        for _ in range(200):
            world.controller()
            sweep = client.get(f"/v1/sweeps/{sweep_id}").json()
            if sweep["status"] != "running":
                break
            world.step({t["job_id"]: t["params"]["train.lr"] for t in sweep["trials"] if t["job_id"]})
        assert sweep["status"] == "succeeded"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    config = {"url": f"{services.url}/", "key": ADMIN_TOKEN, "sweepId": sweep_id, "chromium": CHROMIUM, "outDir": str(shots)}
    run = subprocess.run(["node", str(Path(__file__).with_name("sweep.mjs"))], env={**os.environ, "DRIVE_CONFIG": json.dumps(config)},
                         capture_output=True, text=True, timeout=240)
    lines = run.stdout.strip().splitlines()
    assert lines, f"the browser driver printed nothing (exit {run.returncode}):\n{run.stderr}"
    seen = json.loads(lines[-1])
    assert seen.get("error") is None and not seen.get("problems"), seen
    assert seen["hash"] == f"#/sweeps/{sweep_id}"
    assert len(seen["rows"]) == 9 and sum(r["greyed"] for r in seen["rows"]) == 8
    assert seen["curves"] == {"series": 9, "greyed": 8}
    assert seen["scatterPoints"] == 9
    assert "train.lr=0.01" in seen["best"]
    assert seen["compare"].startswith("#/compare/") and seen["compared"] >= 2
