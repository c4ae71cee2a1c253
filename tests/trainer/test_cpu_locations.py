"""torch.load onto an indexed CPU device (``cpu:0``, the device Accelerate gives CPU ranks, which the Hugging Face
Trainer 4.x loads a resumed optimizer onto) restores in a rank once the bootstrap's hook is in, torch loaded after."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import ROOT
from trainer import cpu_locations

LOAD = """
import io, sys
{install}
import torch
saved = io.BytesIO()
torch.save({{"exp_avg": torch.arange(3.0)}}, saved)
saved.seek(0)
try:
    loaded = torch.load(saved, map_location=torch.device("cpu", 0), weights_only=True)
except RuntimeError as exc:
    sys.exit(str(exc))
print(loaded["exp_avg"].tolist(), loaded["exp_avg"].device)
"""


def _load(install: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LOAD.format(install=install)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow  # torch processes that train: not in the quick loop
def test_a_load_onto_cpu_0_restores_on_the_cpu_with_the_hook_and_fails_without() -> None:
    hooked = _load("from trainer import cpu_locations; cpu_locations.install()")
    assert hooked.returncode == 0 and hooked.stdout.strip() == "[0.0, 1.0, 2.0] cpu", hooked.stderr[-2000:]
    plain = _load("")
    assert plain.returncode != 0 and "tagged with cpu:0" in plain.stderr  # torch's own words, without the hook


@given(st.text(max_size=12))
def test_only_indexed_cpu_locations_are_taken(location: str) -> None:
    storage = object()
    kind, _, index = location.partition(":")
    taken = cpu_locations.restore(storage, location)
    assert (taken is storage) == (kind == "cpu" and index.isdigit())
    assert taken is None or taken is storage
