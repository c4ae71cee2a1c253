"""SIGTERM to torchrun (what the worker does on cancel/preempt): ranks finish the step, save, exit 75."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from jobspec.exit_codes import PREEMPTED_EXIT_CODE
from tests.trainer.helpers import REPO, events, rank_env, spec, torchrun_cmd
from trainer.checkpoint import read_meta

pytestmark = pytest.mark.slow


def _start(spec_file: Path, run_dir: Path, log_dir: Path) -> subprocess.Popen:
    cmd = torchrun_cmd(2, "--log-dir", str(log_dir), "--redirects", "3",
                       "-m", "trainer", "--spec", str(spec_file), "--run-dir", str(run_dir))
    return subprocess.Popen(cmd, env=rank_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"torchrun ended early ({proc.returncode}): {proc.stderr.read()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.1)


def test_sigterm_saves_and_exits_preempted_then_resumes(tmp_path: Path) -> None:
    job = spec("preempt", max_steps=100_000, checkpoint={"every_steps": 100_000, "keep_last": 2})
    job["train"].update(log_every_steps=5, epochs=10_000)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job))
    run_dir = tmp_path / "run"

    proc = _start(spec_file, run_dir, tmp_path / "logs1")
    _wait_for(lambda: any(e["type"] == "metric" for e in events(run_dir)), proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    evs = events(run_dir)
    last = evs[-1]
    assert last["type"] == "status" and last["phase"] == "preempted", evs[-3:]
    step = last["step"]
    ckpt = [e for e in evs if e["type"] == "checkpoint"][-1]
    assert ckpt["step"] == step and ckpt["path"] == f"checkpoints/step_{step:08d}"
    assert read_meta(run_dir)["step"] == step  # both ranks stopped after the same step and saved it
    # Reports overlap the next step (trainer.metrics): none in flight at the signal is lost, and each comes before
    # the checkpoint that follows it.
    # Training reports only: eval results and train/epoch_loss come in metric events of their own cadence.
    reported = [e["step"] for e in evs if e["type"] == "metric" and "train/loss" in e["values"]]
    assert reported == list(range(5, step + 1, 5)), (reported, step)
    assert [e["type"] for e in evs].index("checkpoint") > max(i for i, e in enumerate(evs) if e["type"] == "metric")
    logs = "".join(p.read_text() for p in (tmp_path / "logs1").rglob("stderr.log"))
    assert "stopped by signal after step" in logs

    # Resume: picks up at step + 1 and keeps the seq numbering.
    proc = _start(spec_file, run_dir, tmp_path / "logs2")
    _wait_for(lambda: any(e.get("phase") == "training" for e in events(run_dir)[len(evs):]), proc)
    training = next(e for e in events(run_dir)[len(evs):] if e.get("phase") == "training")
    assert training["resumed_from_step"] == step
    assert training["seq"] > last["seq"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert events(run_dir)[-1]["phase"] == "preempted"
    assert json.loads(json.dumps(events(run_dir)[-1]))["step"] > step


def test_trainer_exit_code_by_hand(tmp_path: Path) -> None:
    """Started by hand (no torchrun), SIGTERM gives the worker's 'preempted' exit code itself."""
    job = spec("byhand", nproc=1, max_steps=100_000, epochs=10_000, checkpoint={"every_steps": 100_000, "keep_last": 1})
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(job))
    run_dir = tmp_path / "run"
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--spec", str(spec_file), "--run-dir", str(run_dir)],
                            env=rank_env(), cwd=REPO, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: any(e["type"] == "metric" for e in events(run_dir)), proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == PREEMPTED_EXIT_CODE
    assert events(run_dir)[-1]["phase"] == "preempted"
