"""Requirements environments on their own (real venv, real pip from the package index): two jobs that
need the same environment at once build it once; a build past its time limit, or interrupted, leaves
nothing behind."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from jobs.settings import Settings
from worker import venvs

pytestmark = pytest.mark.slow

REQUIREMENTS = ["toolz==1.0.0"]  # tiny, pure Python, no dependencies, not in the worker's environment


def settings_in(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(runs_dir=tmp_path / "runs", venvs_dir=tmp_path / "venvs", **overrides)  # type: ignore[arg-type]


def test_concurrent_jobs_build_one_environment_and_it_layers_over_the_workers(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    results: dict[int, str | None] = {}
    waited: list[int] = []

    def job(i: int) -> None:
        def keep_going() -> bool:
            waited.append(i)
            return True

        results[i] = venvs.ensure(settings, REQUIREMENTS, tmp_path / f"job{i}.log", keep_going)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results[0] == results[1] and results[0] is not None
    built = [p for p in (tmp_path / "venvs").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(built) == 1  # one build; the other job waited on the lock and found it
    logs = [(tmp_path / f"job{i}.log") for i in range(2)]
    assert sum(p.exists() and "pip" in p.read_text() for p in logs) == 1
    assert set(waited) == {0, 1}  # both kept heart-beating while the build ran

    python = results[0]
    out = subprocess.run([python, "-c", "import toolz, torch, trainer, sys; print(torch.__version__, sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0].startswith("2.13.0") and out[1] == str(built[0])  # torch from the worker's environment, not reinstalled
    assert not list(built[0].glob("lib/python*/site-packages/torch"))
    assert venvs.interpreter(settings, list(reversed(REQUIREMENTS))) == python  # keyed by the list, in any order


def test_a_build_past_its_time_limit_or_interrupted_leaves_nothing(tmp_path: Path) -> None:
    slow = settings_in(tmp_path, requirements_timeout_s=0.5)
    with pytest.raises(venvs.SetupFailed, match="longer than TORCHYARD_REQUIREMENTS_TIMEOUT_S"):
        venvs.ensure(slow, REQUIREMENTS, tmp_path / "slow.log", lambda: True)
    assert [p.name for p in (tmp_path / "venvs").iterdir() if not p.name.endswith(".lock")] == []

    started = time.monotonic()
    with pytest.raises(venvs.SetupInterrupted):
        venvs.ensure(settings_in(tmp_path), REQUIREMENTS, tmp_path / "cancel.log", lambda: time.monotonic() - started < 0.5)
    assert [p.name for p in (tmp_path / "venvs").iterdir() if not p.name.endswith(".lock")] == []
    with pytest.raises(venvs.SetupFailed):
        venvs.interpreter(settings_in(tmp_path), REQUIREMENTS)
