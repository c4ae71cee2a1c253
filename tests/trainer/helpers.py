"""Launch helpers for the trainer tests: real torchrun on gloo/CPU, tiny jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUN_CASES = Path(__file__).with_name("run_cases.py")


def rank_env(**extra: str) -> dict[str, str]:
    # One thread per rank: the ranks share two cores with other test processes.
    env = {k: v for k, v in os.environ.items() if k != "TORCHYARD_DATA_DIR"}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TORCHYARD_LOG_LEVEL": "WARNING", **extra}


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def run_cases(tmp: Path, nproc: int, cases: list[dict[str, Any]], timeout: float = 240) -> None:
    """Run all cases in one torchrun launch; raises with the ranks' output when it fails."""
    cases_file = tmp / f"cases-{nproc}-{len(list(tmp.glob('cases-*')))}.json"
    cases_file.write_text(json.dumps(cases))
    proc = subprocess.run(torchrun_cmd(nproc, str(RUN_CASES), str(cases_file)), env=rank_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train_losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["values"]["train/loss"] for e in events(run_dir) if e["type"] == "metric" and "train/loss" in e["values"]}


def spec(name: str, *, model: dict | None = None, data: dict | None = None, nproc: int = 2, strategy: str = "ddp",
         **train: Any) -> dict[str, Any]:
    """A tiny job: fp32 on the CPU, metrics every step."""
    ckpt = train.pop("checkpoint", {"every_steps": 4, "keep_last": 10})
    return {
        "name": name,
        "model": model or {"name": "mlp", "args": {"hidden": 32, "layers": 2}},
        "data": data or {"name": "synthetic-classification", "args": {"samples": 512, "eval_samples": 64, "features": 16}},
        "parallel": {"strategy": strategy, "nproc_per_node": nproc, "device": "cpu"},
        "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 1, "seed": 3,
                  "schedule": {"name": "cosine", "warmup_steps": 2}, **train},
        "eval": {"every_steps": 100},
        "checkpoint": ckpt,
    }


def assert_close_seq(a: dict[int, float], b: dict[int, float], tol: float, steps: range | None = None) -> None:
    steps = steps or range(1, max(a) + 1)
    assert all(s in a and s in b for s in steps), f"missing steps: {sorted(a)} vs {sorted(b)}"
    diffs = {s: abs(a[s] - b[s]) for s in steps}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= tol, f"step {worst}: {a[worst]} vs {b[worst]} (|diff| {diffs[worst]:.2e} > {tol})"
