"""A requirement that only exists as source fails under the wheels-only default with pip's own words and the
operator setting that allows source builds. Real venv and pip, offline: the index is a local directory."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.settings import Settings
from worker import venvs

NO_WHEEL = ("ERROR: Could not find a version that satisfies the requirement antlr4-python3-runtime==4.9.3 (from versions: none) "
            "ERROR: No matching distribution found for antlr4-python3-runtime==4.9.3")


def test_a_source_only_requirement_names_the_setting_that_allows_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = tmp_path / "index"
    index.mkdir()
    with tarfile.open(index / "sourceonlypkg-1.0.tar.gz", "w:gz"):
        pass  # pip sees a source distribution by its name; wheels only never opens it
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    settings = Settings(runs_dir=tmp_path / "runs", venvs_dir=tmp_path / "venvs")  # type: ignore[call-arg]
    with pytest.raises(venvs.SetupFailed) as failed:
        venvs.ensure(settings, ["sourceonlypkg==1.0"], tmp_path / "requirements.log", lambda: True)
    message = str(failed.value)
    assert "No matching distribution found for sourceonlypkg==1.0" in message, message
    assert "TORCHYARD_REQUIREMENTS_ONLY_BINARY=false" in message, message


@given(st.text(max_size=200), st.booleans())
def test_the_hint_is_added_only_when_wheels_only_can_be_the_cause(message: str, only_binary: bool) -> None:
    explained = venvs.wheels_only_hint(message, only_binary)
    assert explained.startswith(message)
    assert (explained != message) == (only_binary and any(w in message for w in venvs._NO_WHEEL))
    assert venvs.ONLY_BINARY_SETTING in venvs.wheels_only_hint(NO_WHEEL, True)
    assert venvs.wheels_only_hint(NO_WHEEL, False) == NO_WHEEL
