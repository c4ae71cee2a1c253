"""The dashboard's other views in headless Chromium against a live service: the hosts grid with a running job's id in
its GPU cell (a tenant's job named too, for the admin), a finished script job whose empty panels say so and whose bar
is full, a retried job's link to the job it resumed from with the step, and the compare view's spec diff of a catalog
job beside a script job without unset noise."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard.test_dashboard import CHROMIUM, playwright_core  # noqa: F401 - the fixture is shared
from tests.helpers import ADMIN_TOKEN, Services

pytestmark = pytest.mark.slow

CATALOG = {
    "name": "mlp-small",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 256, "eval_samples": 64, "features": 8, "classes": 4}},
    "parallel": {"nproc_per_node": 1, "device": "cpu"},
    "train": {"epochs": 1, "global_batch_size": 32, "log_every_steps": 2},
    "checkpoint": {"every_steps": 4},
}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def submit(client: httpx.Client, spec: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    resp = client.post("/v1/jobs", json=spec, headers=headers)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_hosts_lineage_finished_panels_and_spec_diff(services: Services, playwright_core: Path, tmp_path: Path) -> None:  # noqa: F811
    code = services.settings.code_dir
    (code / "wait.py").write_text(textwrap.dedent("""
        import pathlib, sys, time
        while not pathlib.Path(sys.argv[1]).exists():
            time.sleep(0.1)
    """))
    (code / "hello.py").write_text("print('hello from a script job')\n")
    release = services.settings.runs_dir.parent / "release"
    services.start_api()
    services.start_worker("gpu-box", TORCHYARD_WORKER_GPUS="2", TORCHYARD_WORKER_CPU_SLOTS="2")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with services.client() as client:
        held = submit(client, {"kind": "script", "name": "holds-a-gpu", "entrypoint": "wait.py", "args": [str(release)],
                               "parallel": {"nproc_per_node": 1, "device": "cuda"}})
        alice = {"Authorization": f"Bearer {client.post('/v1/keys', json={'owner': 'alice', 'name': 'a'}).json()['key']}"}
        hers = submit(client, {"kind": "script", "name": "alices-gpu", "entrypoint": "wait.py", "args": [str(release)],
                               "parallel": {"nproc_per_node": 1, "device": "cuda"}}, headers=alice)
        services.wait_status(client, hers, {"running"}, timeout_s=60)
        script = submit(client, {"kind": "script", "name": "hello", "entrypoint": "hello.py", "parallel": {"device": "cpu"}})
        catalog = submit(client, CATALOG)
        services.wait_status(client, held, {"running"}, timeout_s=60)
        assert services.wait_status(client, script, {"succeeded", "failed"}, timeout_s=120)["status"] == "succeeded"
        assert services.wait_status(client, catalog, {"succeeded", "failed"}, timeout_s=120)["status"] == "succeeded"
        last_checkpoint = client.get(f"/v1/jobs/{catalog}/checkpoints").json()["items"][-1]["step"]
        retry = client.post(f"/v1/jobs/{catalog}/retry").json()["id"]
        retried = services.wait_status(client, retry, {"succeeded", "failed"}, timeout_s=120)
        assert retried["status"] == "succeeded" and retried["attempts"][-1]["resumed_from_step"] == last_checkpoint

        config = {"url": f"{services.url}/", "key": ADMIN_TOKEN, "chromium": CHROMIUM, "outDir": str(shots),
                  "held": held, "script": script, "catalog": catalog, "retry": retry}
        run = subprocess.run(["node", str(Path(__file__).with_name("views.mjs"))], env={**os.environ, "DRIVE_CONFIG": json.dumps(config)},
                             capture_output=True, text=True, timeout=180)
        release.touch()
        lines = run.stdout.strip().splitlines()
        assert lines, f"the browser driver printed nothing (exit {run.returncode}):\n{run.stderr}"
        seen = json.loads(lines[-1])
        assert run.returncode == 0 and "error" not in seen, f"{seen.get('error')}\n{run.stderr}\nscreenshots in {shots}"
        services.wait_status(client, held, {"succeeded", "cancelled", "failed"}, timeout_s=60)
        services.wait_status(client, hers, {"succeeded", "cancelled", "failed"}, timeout_s=60)

    # The job list: succeeded jobs full (the script job has no step count at all), the running one empty; each
    # job's priority (the default, 50).
    assert "Priority" in seen["headers"]
    assert seen["rows"]["catalog"]["pct"] == 100 and seen["rows"]["catalog"]["barWidth"] == "100%"
    assert seen["rows"]["script"]["pct"] == 100 and seen["rows"]["script"]["barWidth"] == "100%"
    assert seen["rows"]["held"]["pct"] == 0
    assert seen["rows"]["catalog"]["priority"] == "50"
    assert len(set(seen["barWidths"])) == 1, seen["barWidths"]  # "8/8" and "–" labels: bars of one width

    # Hosts: GPU 0 holds the waiting job, named, and links to it; GPU 1 alice's, named for the admin too; the CPU slots
    # and last report shown.
    assert seen["gpus"][0] == {"index": "0", "state": "held", "text": f"GPU 0holds-a-gpu{held}", "link": f"#/jobs/{held}"}
    assert seen["gpus"][1] == {"index": "1", "state": "held", "text": f"GPU 1alices-gpu{hers}", "link": f"#/jobs/{hers}"}
    assert "2/2 GPUs in use" in seen["hostMeta"] and "CPU slots 0/2 used" in seen["hostMeta"] and "last seen" in seen["hostMeta"]

    # Usage: every owner's row for the admin, GPU-hours from the attempts (the held jobs' GPUs and the finished jobs'
    # CPU slots), drawn.
    rows = {r["owner"]: r["cells"] for r in seen["usage"]["rows"]}
    assert sorted(rows) == ["admin", "alice"] and "admin" in seen["usage"]["owners"], seen["usage"]
    assert seen["usage"]["points"] >= 1 and float(rows["admin"][1]) > 0, seen["usage"]

    # The finished script job: no panel waits for metrics; the ones without data say it has none.
    assert all(p["text"] is None or "waiting" not in p["text"] for p in seen["panels"]), seen["panels"]
    assert {p["id"]: p["text"] for p in seen["panels"]}["chart-eval"] == "this job recorded no eval accuracy"
    assert seen["scriptBar"] == "100%"
    # A preemption in the timeline names the job that preempted, as a link.
    assert seen["preemption"] == {"text": f"preempted by job {held} (priority 80)", "href": f"#/jobs/{held}"}

    # Lineage: the retry links to the job it resumed from, with the step.
    assert seen["lineage"]["href"] == f"#/jobs/{catalog}" and seen["lineage"]["step"] == last_checkpoint
    assert f"retry of job {catalog}" in seen["lineage"]["text"] and f"resumed from step {last_checkpoint}" in seen["lineage"]["text"]
    assert seen["timeline"][-1] == "succeeded"
    assert seen["followedTo"] == f"#/jobs/{catalog}"

    # The compare view's diff: grouped, each row differing and set somewhere; nothing unset on both sides.
    groups = {g["group"]: {r["field"]: r["cells"] for r in g["rows"]} for g in seen["diff"]}
    assert groups["job"]["kind"] == ["catalog", "script"] and groups["job"]["entrypoint"] == ["unset", "hello.py"]
    assert groups["model"]["model.name"] == ["mlp", "unset"]
    for group in groups.values():
        for field, cells in group.items():
            assert any(c != "unset" for c in cells) and len(set(cells)) > 1, (field, cells)
    assert "eval.every_steps" not in groups.get("eval", {})  # null in one spec, missing from the other: unset on both
    # Sections only the catalog job has fold into one line each, their fields a click away; kind and entrypoint show.
    folded = {g["group"]: (g["onlyIn"], g["shown"]) for g in seen["diff"]}
    assert folded["job"] == (None, 2)
    assert all(folded[g] == ("0", 0) for g in ("model", "data", "train")), folded
    assert seen["trainShownAfterClick"] == len(groups["train"]) > 5
    assert seen["problems"] == [], seen["problems"]
