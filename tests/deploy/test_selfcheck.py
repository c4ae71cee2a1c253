"""`python -m trainer.selfcheck`, which the worker image runs at build time: it passes in a complete
environment and fails, naming the cause, in one without numpy (the image that failed its users'
first checkpoint)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.composefile import ROOT

pytestmark = pytest.mark.slow

BLOCK_NUMPY = (
    "import sys\n"
    "class _NoNumpy:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'numpy' or name.startswith('numpy.'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
    "sys.meta_path.insert(0, _NoNumpy())\n"
)


def _selfcheck(tmp_path: Path, extra_path: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (extra_path, str(ROOT)) if p), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "trainer.selfcheck"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)


def test_selfcheck_trains_every_catalog_path(tmp_path: Path) -> None:
    result = _selfcheck(tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    for job in ("mlp-npz-async", "cnn-pt", "resnet-fsdp", "vit-safetensors-fsdp", "gpt-text-fsdp", "gpt-lm-bf16"):
        assert f"ok  {job}" in result.stderr
    assert "selfcheck passed" in result.stderr
    assert list(tmp_path.glob("torchyard-selfcheck-*")) == [], "the selfcheck left its work directory behind"


def test_selfcheck_fails_without_numpy(tmp_path: Path) -> None:
    blocker = tmp_path / "no-numpy"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_NUMPY, encoding="utf-8")
    result = _selfcheck(tmp_path, str(blocker))
    assert result.returncode == 1
    assert "selfcheck failed" in result.stderr and "No module named 'numpy'" in result.stderr, result.stderr[-4000:]
