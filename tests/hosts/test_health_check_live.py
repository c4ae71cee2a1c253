"""The host's health check on real processes: the worker runs TORCHYARD_HOST_HEALTH_CMD on its interval; a failing
check drains the host with its last output line, the next passing one undrains it, and an admin's drain (through the
CLI) stays until the admin undrains it, whatever the check says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.helpers import Services, wait_until
from torchyard.cli.main import app

pytestmark = pytest.mark.slow


def host(client: httpx.Client) -> dict[str, Any]:
    return client.get("/v1/hosts/gpu-box").json()


def runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_failing_health_check_drains_the_host_and_a_passing_one_undrains_it(services: Services) -> None:
    base = services.settings.runs_dir.parent
    sick, log = base / "sick", base / "health-runs"
    command = f"echo run >> {log}; if [ -e {sick} ]; then echo checking fans; cat {sick}; exit 1; fi"
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="1", TORCHYARD_HOST_HEALTH_CMD=command,
                          TORCHYARD_HOST_HEALTH_INTERVAL_S="0.3")
    env = {"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": services.headers["Authorization"].removeprefix("Bearer ")}
    with services.client() as client:
        wait_until(lambda: runs(log) >= 1 and client.get("/v1/hosts/gpu-box").status_code == 200, 60, what="a first health check")
        assert host(client)["state"] == "ready"

        sick.write_text("fan 3 stopped\n")
        drained = wait_until(lambda: (h := host(client))["state"] == "drained" and h, 60, what="the health check's drain")
        assert drained["reason"] == "health check failed: fan 3 stopped"
        sick.unlink()
        wait_until(lambda: host(client)["state"] == "ready", 60, what="the health check's undrain")
        assert [(e["kind"], e["by"]) for e in host(client)["history"]] == [("drain", "health-check"), ("undrain", "health-check")]

        printed = CliRunner().invoke(app, ["hosts", "drain", "gpu-box", "--reason", "new fans"], env=env)
        assert printed.exit_code == 0 and "gpu-box: drained (new fans)" in printed.output, printed.output
        seen = runs(log)
        wait_until(lambda: runs(log) >= seen + 2, 60, what="two more passing health checks")
        assert (host(client)["state"], host(client)["reason"]) == ("drained", "new fans")  # the admin's to undo
        listed = CliRunner().invoke(app, ["hosts"], env=env)
        assert listed.exit_code == 0 and "drained (new fans)" in listed.output, listed.output
        printed = CliRunner().invoke(app, ["hosts", "undrain", "gpu-box"], env=env)
        assert printed.exit_code == 0 and "gpu-box: ready" in printed.output, printed.output
        assert [e["by"] for e in host(client)["history"]][-2:] == ["admin", "admin"]
