"""With an object store the worker's AWS_* variables are its credentials to it: they never reach a job's ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.settings import Settings
from worker.launch import torchrun_env


def test_store_credentials_never_reach_the_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/etc/torchyard/aws")
    with_store = Settings(storage_url="s3://bucket/p", runs_dir=tmp_path, data_dir=tmp_path)
    env = torchrun_env("j1", 1, tmp_path, with_store)
    assert not [k for k in env if k.startswith("AWS_")]
    assert "worker-secret" not in env.values()
    # Without the setting nothing changes: the worker's environment passes as before.
    assert torchrun_env("j1", 1, tmp_path, Settings(runs_dir=tmp_path, data_dir=tmp_path))["AWS_SECRET_ACCESS_KEY"] == "worker-secret"
