"""The job contract imports without torch and without trainer/: the API image, the scheduler and the worker's
supervisor load it, and none of them may pay for torch or depend on what runs inside the ranks."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import jobspec

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, json, pkgutil, sys
import jobspec
for info in pkgutil.walk_packages(jobspec.__path__, "jobspec."):
    importlib.import_module(info.name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "trainer"})))
"""


def test_the_contract_imports_neither_torch_nor_trainer() -> None:
    modules = [info.name for info in pkgutil.walk_packages(jobspec.__path__, "jobspec.")]
    assert "jobspec.spec" in modules  # the probe below walks the package, not an empty directory
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
