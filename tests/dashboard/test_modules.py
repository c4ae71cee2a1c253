"""The dashboard's pure modules (formatting, lineage, the compare view's spec diff) under node's own test runner:
what the page prints for a given job JSON, without a browser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def test_pure_modules_under_node() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH: `make install-browser` installs Node.js")
    run = subprocess.run([node, "--test", str(Path(__file__).with_name("modules.test.mjs"))], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert "# fail 0" in run.stdout
