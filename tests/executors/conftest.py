"""Executors driven directly, as the supervisor drives them: start, poll, stop, release.

Slurm is real: a private single-host cluster (stack/slurm_cluster.py) started once per module,
skipped with the reason when Debian's slurm-wlm and munge are not installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.settings import Settings
from jobspec.spec import parse_spec
from stack import slurm_cluster
from stack.slurm_cluster import SlurmCluster
from tests.conftest import make_settings
from tests.helpers import ROOT, wait_until
from worker.executors.base import Executor, Launch, LaunchRequest, RankState


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_cluster.missing()
    if reason:
        pytest.skip(reason)
    # Short enough that a test's preemption or time limit ends quickly, long enough for a tiny checkpoint.
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=2, grace_s=30, kill_wait_s=10) as cluster:
        yield cluster


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the ranks inherit from the worker: one thread each, quiet logs, this checkout's code."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCHYARD_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def executor_settings(tmp_path: Path, cluster: SlurmCluster | None = None, **overrides: object) -> Settings:
    values: dict[str, object] = {"stop_grace_s": 20.0}
    if cluster is not None:
        values.update(executor="slurm", slurm_conf=cluster.conf, slurm_partition="batch", slurm_cpus_per_rank=1,
                      slurm_gpus=False, slurm_poll_interval_s=0.5)
    values.update(overrides)
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'unused.db'}", "redis://127.0.0.1:1/0", **values)


def job_spec(steps: int, nproc: int = 2, **overrides: Any) -> dict[str, Any]:
    """A tiny 2-rank MLP on gloo: ``steps`` optimizer steps, each logged, a checkpoint every 4."""
    body: dict[str, Any] = {
        "name": "executor-test",
        "model": {"name": "mlp", "args": {"hidden": 16}},
        "data": {"name": "synthetic-classification", "args": {"samples": steps * 32, "eval_samples": 64, "features": 8, "classes": 3}},
        "parallel": {"strategy": "ddp", "nproc_per_node": nproc, "device": "cpu"},
        "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 1},
        "checkpoint": {"every_steps": 4},
        **overrides,
    }
    return body


def request(settings: Settings, job_id: str, spec: dict[str, Any], attempt: int = 1) -> LaunchRequest:
    """What the supervisor hands an executor once it claimed the attempt and wrote spec.json."""
    run_dir = (settings.runs_dir / job_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    return LaunchRequest(job_id=job_id, attempt=attempt, run_dir=run_dir, spec=parse_spec(spec))


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def phases(run_dir: Path) -> list[str]:
    return [e["phase"] for e in events(run_dir) if e["type"] == "status"]


def wait_step(run_dir: Path, step: int = 1, timeout_s: float = 180) -> None:
    wait_until(lambda: any(e["type"] == "metric" and e.get("step", 0) >= step for e in events(run_dir)), timeout_s,
               what=f"step {step} in {run_dir / 'events.jsonl'}")


def wait_ended(executor: Executor, launch: Launch, timeout_s: float = 240) -> RankState:
    return wait_until(lambda: (s := executor.poll(launch)).ended and s, timeout_s, interval_s=0.5, what="the ranks to end")
