"""No host read of a tensor's value in a training step that does not report: on a GPU each one would stall the
queue of kernels (docs/BENCHMARKS.md, "On a GPU")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.helpers import REPO, rank_env, spec

pytestmark = pytest.mark.slow

EVERY = 4
STEPS = 10


def test_only_reporting_steps_read_tensors_on_the_host(tmp_path: Path) -> None:
    job = spec("reads", model={"name": "gpt", "args": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}},
               data={"name": "synthetic-lm", "args": {"samples": 512, "eval_samples": 0, "vocab_size": 32, "seq_len": 16}},
               nproc=1, max_steps=STEPS, log_every_steps=EVERY, precision="bf16", checkpoint={"every_steps": 1000, "keep_last": 1})
    (spec_path := tmp_path / "spec.json").write_text(json.dumps(job))
    out = tmp_path / "reads.json"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "trainer" / "count_host_reads.py"), str(spec_path),
                           str(tmp_path / "run"), str(out)], env=rank_env(), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["exit_code"] == 0
    reads = {int(s): where for s, where in result["reads"].items()}
    # A report is started at a log step and completed (its values read back) during the next step; the last step
    # reports at once. Nothing else in any step reads a tensor.
    allowed = {s + 1 for s in range(EVERY, STEPS, EVERY)} | {STEPS}
    stray = {s: where for s, where in reads.items() if s not in allowed or any("flush" not in w for w in where)}
    assert not stray, stray
    assert set(reads) <= allowed and reads  # the reports do read: the count is live
