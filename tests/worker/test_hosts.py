"""A worker registers its host in SQL with the GPUs it declares and heartbeats it; a job it runs holds those GPUs
in its placement (GET /v1/hosts, the job and its attempt); a worker that stops takes its host off at once."""

from __future__ import annotations

import signal
import textwrap

import pytest
from typer.testing import CliRunner

from tests.helpers import Services, wait_until
from torchyard.cli.main import app

pytestmark = pytest.mark.slow


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_worker_registers_its_host_and_a_job_holds_its_gpus_while_it_runs(services: Services) -> None:
    (services.settings.code_dir / "wait.py").write_text(textwrap.dedent("""
        import os, pathlib, sys, time
        stop = pathlib.Path(sys.argv[1])
        while not stop.exists():
            time.sleep(0.1)
    """))
    release = services.settings.runs_dir.parent / "release"
    services.start_api()
    worker = services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="4", TORCHYARD_WORKER_CPU_SLOTS="3")
    with services.client() as client:
        def host() -> dict | None:
            items = client.get("/v1/hosts").json()["items"]
            return items[0] if items and items[0]["alive"] else None

        seen = wait_until(host, 30, what="the worker's host to register")
        assert seen["id"] == "gpu-box"
        assert [g["index"] for g in seen["gpus"]] == [0, 1, 2, 3]
        assert seen["cpu_slots"] == {"total": 3, "used": 0}
        assert seen["queues"] == ["default"] and seen["executor"] == "local"

        spec = {"kind": "script", "name": "wait", "entrypoint": "wait.py", "args": [str(release)],
                "parallel": {"nproc_per_node": 2, "device": "cuda"}}
        job_id = client.post("/v1/jobs", json=spec).json()["id"]
        services.wait_status(client, job_id, {"running"}, timeout_s=60)
        placement = [{"node_rank": 0, "host": "gpu-box", "gpus": [0, 1], "cpu_slots": 0}]
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["placement"] == placement
        assert job["attempts"][-1]["placement"] == placement
        gpus = host()["gpus"]  # type: ignore[index]
        assert [(g["index"], g["job_id"]) for g in gpus] == [(0, job_id), (1, job_id), (2, None), (3, None)]
        env = {"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": services.headers["Authorization"].removeprefix("Bearer ")}
        printed = CliRunner().invoke(app, ["hosts"], env=env)
        assert printed.exit_code == 0, printed.output
        assert "gpu-box" in printed.output and f"0:{job_id} 1:{job_id} 2:free 3:free" in printed.output
        assert "2/4" in printed.output and "0/3 used" in printed.output

        client.post(f"/v1/jobs/{job_id}/cancel")
        release.touch()
        services.wait_status(client, job_id, {"cancelled", "succeeded"}, timeout_s=60)
        assert not any(g["busy"] for g in client.get("/v1/hosts").json()["items"][0]["gpus"])

        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        gone = client.get("/v1/hosts").json()["items"][0]
        assert gone["alive"] is False and gone["last_seen"] is None
