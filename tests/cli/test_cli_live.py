"""The CLI against a live service (real redis-server, API and worker processes, torchrun with two
gloo ranks): submit --follow to success, status, ls, logs, metrics and a PNG plot; cancel through
the CLI while another CLI process follows the job, retry it, rm both with their run directories; a failing job makes
submit --follow exit 1."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from tests.cli.conftest import cli
from tests.helpers import ROOT, Services, wait_until
from torchyard.cli.main import app
from torchyard.client import Client, ClientConfig, load_config

pytestmark = pytest.mark.slow

TINY = {
    "name": "cli-tiny",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 512, "eval_samples": 128, "features": 8, "classes": 4}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 2, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 4},
    "eval": {"every_steps": 16},
    "checkpoint": {"every_steps": 16, "keep_last": 2},
}
# Runs until cancelled (or for minutes on a very fast machine), logging often enough to follow.
LONG = {**TINY, "name": "cli-long", "train": {**TINY["train"], "epochs": 100_000, "max_steps": 200_000, "log_every_steps": 20},
        "eval": {"every_steps": 200}, "checkpoint": {"every_steps": 1000, "keep_last": 1}}


def write_spec(tmp_path: Path, spec: dict, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_submit_follow_status_ls_logs_metrics_and_plot(live: Services, tmp_path: Path) -> None:
    code, out = cli(live, "submit", str(write_spec(tmp_path, TINY)), "--follow")
    assert code == 0, out
    job_id = out.split()[1]  # "submitted <id> (name), queued ..."
    assert f"{job_id} succeeded" in out
    assert "step 32/32" in out and "samples/s" in out  # the live progress lines
    assert "checkpoint step 32" in out

    code, out = cli(live, "status", job_id)
    assert code == 0 and "succeeded" in out and "32/32" in out and "train/loss" in out

    code, out = cli(live, "ls", "--json")
    assert code == 0 and [j["id"] for j in json.loads(out)["items"]] == [job_id]
    code, out = cli(live, "ls", "--status", "succeeded")
    assert code == 0 and job_id in out and "cli-tiny" in out

    code, out = cli(live, "logs", job_id, "--rank", "0")
    assert code == 0 and "training steps 1..32" in out, out
    code, out = cli(live, "logs", job_id, "--rank", "1", "--tail", "2")
    assert code == 0 and len(out.strip().splitlines()) <= 2
    code, out = cli(live, "logs", job_id, "-f", "--rank", "0")  # the attempt is over: prints and returns
    assert code == 0 and "training steps" in out

    code, out = cli(live, "metrics", job_id, "--name", "train/loss", "--last", "0")
    assert code == 0 and "loss" in out and len([line for line in out.splitlines() if line.strip()]) == 1 + 32 // 4
    png = tmp_path / "metrics.png"
    code, out = cli(live, "metrics", job_id, "--plot", str(png))
    assert code == 0, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    code, out = cli(live, "cancel", job_id)
    assert code == 4 and "already succeeded" in out

    # Weights: the latest that has them, or one step's; into a file or a directory.
    target = tmp_path / "final.safetensors"
    code, out = cli(live, "download", job_id, "-o", str(target), "--json")
    assert code == 0, out
    assert json.loads(out)["path"] == str(target) and json.loads(out)["size_bytes"] == target.stat().st_size
    assert load_file(target)  # a real safetensors file with tensors in it
    code, out = cli(live, "download", job_id, "--step", "32", "-o", str(tmp_path))
    assert code == 0 and f"{job_id}-step32-" in out, out
    code, out = cli(live, "download", job_id, "--step", "3")
    assert code == 4 and "no checkpoint at step 3" in out

    code, out = cli(live, "--version")
    assert code == 0 and out.startswith("torchyard 0.")
    # Typer detects the shell from the process's ancestors (a word after the flag is ignored): asked from bash, as a
    # user would, it prints bash's script; in-process the nearest shell is whatever started pytest (sh under make).
    shown = subprocess.run(["bash", "-c", f"{Path(sys.executable).parent / 'torchyard'} --show-completion; exit $?"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "complete -o default -F _torchyard_completion torchyard" in shown.stdout, shown
    code, out = cli(live, "watch", job_id, "--json")
    assert code == 0 and json.loads(out)["status"] == "succeeded"

    # --json on what changes state; ls --all follows the cursor page by page.
    code, out = cli(live, "retry", job_id, "--json")
    assert code == 0, out
    retried = json.loads(out)["id"]
    code, out = cli(live, "cancel", retried, "--json")
    assert code == 0 and json.loads(out)["status"] in ("cancelling", "cancelled"), out
    code, out = cli(live, "ls", "--all", "--limit", "1", "--json")
    assert code == 0 and [j["id"] for j in json.loads(out)["items"]] == [retried, job_id]
    code, out = cli(live, "ls", "--limit", "1")
    assert code == 0 and "--all" in out
    code, out = cli(live, "keys", "create", "--owner", "ci", "--name", "robot", "--json")
    key_id = json.loads(out)["id"]
    code, out = cli(live, "keys", "revoke", key_id, "--json")
    assert code == 0 and json.loads(out) == {"id": key_id, "revoked": True}


def test_login_writes_the_config_file_the_cli_then_uses(live: Services, tmp_path: Path) -> None:
    config = tmp_path / "home" / "torchyard" / "config.toml"
    key = live.headers["Authorization"].removeprefix("Bearer ")
    bare = {"TORCHYARD_URL": None, "TORCHYARD_API_KEY": None, "TORCHYARD_CONFIG": str(config)}

    wrong = CliRunner().invoke(app, ["login", "--url", live.url], input="not-a-key\n", env=bare)
    assert wrong.exit_code == 4 and not config.exists(), wrong.output  # a key the API refuses is never saved

    result = CliRunner().invoke(app, ["login", "--url", live.url], input=f"{key}\n", env=bare)
    assert result.exit_code == 0, result.output
    assert key not in result.output  # typed hidden, never echoed
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert load_config(env={"TORCHYARD_CONFIG": str(config)}) == ClientConfig(url=live.url, api_key=key, source=str(config))

    listed = CliRunner().invoke(app, ["ls", "--json"], env=bare)  # no URL or key but the file's
    assert listed.exit_code == 0 and json.loads(listed.output)["items"] == [], listed.output


def test_cancel_while_following_and_a_failing_job(live: Services, tmp_path: Path) -> None:
    env = {**os.environ, "TORCHYARD_URL": live.url, "TORCHYARD_API_KEY": live.headers["Authorization"].removeprefix("Bearer "),
           "PYTHONPATH": str(ROOT)}
    # A second process follows the job the way a user's terminal would, through `python -m torchyard`.
    follower = subprocess.Popen([sys.executable, "-m", "torchyard", "submit", str(write_spec(tmp_path, LONG)), "--follow"], env=env,
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with Client(live.url, env["TORCHYARD_API_KEY"]) as client:
            job = wait_until(lambda: next(iter(client.list_jobs(name="cli-long").items), None), 30, what="the long job")
            wait_until(lambda: (client.job(job.id).last_step or 0) >= 40, 90, what="training steps")

            code, out = cli(live, "cancel", job.id)
            assert code == 0 and job.id in out and ("cancelling" in out or "cancelled" in out), out
            output, _ = follower.communicate(timeout=90)
            assert follower.returncode == 3, output  # the followed job was cancelled
            assert f"{job.id} cancelled" in output and f"{job.id} step " in output

            code, out = cli(live, "retry", job.id)
            assert code == 0 and "retried" in out, out
            retried = out.split()[3]
            assert retried != job.id and client.job(retried).spec["name"] == "cli-long"
            code, out = cli(live, "cancel", retried)
            assert code == 0, out
            client.wait(retried, timeout=90, poll_interval=0.5)

            # Both finished: rm takes them with their run directories (checkpoints, logs).
            run_dirs = [live.settings.runs_dir / job_id for job_id in (job.id, retried)]
            assert (run_dirs[0] / "logs").is_dir()  # it trained; the retry may have been cancelled before it started
            code, out = cli(live, "rm", job.id, retried)
            assert code == 0 and f"deleted {job.id}" in out and f"deleted {retried}" in out, out
            assert not any(run_dir.exists() for run_dir in run_dirs)
            assert client.list_jobs(name="cli-long").items == []
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()

    # timeout_s=1 stops the attempt and fails the job: submit --follow says so and exits 1.
    spec = write_spec(tmp_path, {**LONG, "name": "cli-timeout"}, "timeout.yaml")
    code, out = cli(live, "submit", str(spec), "--follow", "--set", "timeout_s=1")
    assert code == 1, out
    assert "failed" in out and "timeout" in out
