"""Jobs after jobs on a live service with a real worker: ``torchyard submit --after`` holds a job, with the
dependency named in its reason, until the job before it succeeded; a job after one that fails is cancelled with
``dependency_failed`` and never runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import cli
from tests.helpers import Services, wait_until

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}


def test_a_chain_runs_in_order_and_a_failed_dependency_cancels_what_waits_for_it(live: Services, tmp_path: Path) -> None:
    code_dir, release = live.settings.code_dir, tmp_path / "release"
    (code_dir / "wait.py").write_text(textwrap.dedent(f"""
        import pathlib, time
        deadline = time.time() + 120
        while not pathlib.Path({str(release)!r}).exists() and time.time() < deadline:
            time.sleep(0.1)
    """))
    (code_dir / "after.py").write_text("print('ran after its dependency')\n")
    (code_dir / "fail.py").write_text("raise SystemExit('this one fails')\n")
    spec = tmp_path / "after.yaml"
    spec.write_text(yaml.safe_dump({"kind": "script", "name": "after", "entrypoint": "after.py", "parallel": {"device": "cpu"}}))
    with live.client() as client:
        first = client.post("/v1/jobs", json={"kind": "script", "name": "first", "entrypoint": "wait.py",
                                              "parallel": {"device": "cpu"}}).json()["id"]
        live.wait_status(client, first, {"running"}, timeout_s=120)
        code, out = cli(live, "submit", str(spec), "--after", first, "--quiet")
        assert code == 0, out
        second = out.strip()
        reason = f"waiting for job {first} (running)"
        wait_until(lambda: client.get(f"/v1/jobs/{second}").json()["waiting_reason"] == reason, 60, what="the dependency's reason")
        assert client.get(f"/v1/jobs/{second}").json()["status"] == "queued"

        failing = client.post("/v1/jobs", json={"kind": "script", "name": "fails", "entrypoint": "fail.py",
                                                "parallel": {"device": "cpu"}}).json()["id"]
        doomed = client.post("/v1/jobs", json={"kind": "script", "name": "doomed", "entrypoint": "after.py",
                                               "parallel": {"device": "cpu"}, "depends_on": [failing]}).json()["id"]
        assert live.wait_status(client, failing, TERMINAL, timeout_s=180)["status"] == "failed"
        ended = live.wait_status(client, doomed, TERMINAL, timeout_s=60)
        assert ended["status"] == "cancelled" and ended["error"]["type"] == "dependency_failed", ended
        assert failing in ended["error"]["message"] and not [a for a in ended["attempts"] if a["placement"]], ended  # never placed

        release.touch()
        done_first = live.wait_status(client, first, TERMINAL, timeout_s=120)
        done_second = live.wait_status(client, second, TERMINAL, timeout_s=180)
        assert (done_first["status"], done_second["status"]) == ("succeeded", "succeeded")
        assert done_second["started_at"] >= done_first["finished_at"]
