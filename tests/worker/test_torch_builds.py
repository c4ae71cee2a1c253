"""A job's requirement built against torch (torchvision) resolves to the build of the worker's own torch, from the
worker's torch index, or the job is refused before it runs naming the package, the build found and the build
needed. Real venv and pip, offline: the PyPI stand-in and the torch index are directories of wheels built here."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.tags import sys_tags
from packaging.version import Version

from jobs.settings import Settings
from worker import torch_builds, venvs

pytestmark = pytest.mark.slow

TORCH = importlib.metadata.version("torch")
LABEL = Version(TORCH).local
PLATFORM_TAG = next(t for t in sys_tags() if t.abi == "none" and t.platform != "any")


def _wheel(index: Path, name: str, version: str, requires: list[str], tag: str = str(PLATFORM_TAG)) -> None:
    """A minimal wheel of ``name`` (a module that knows its version) in ``index``'s simple-index layout."""
    dist = f"{name}-{version}"
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n",
             f"{dist}.dist-info/METADATA": "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                                                      *(f"Requires-Dist: {r}" for r in requires)]) + "\n",
             f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b'=').decode()},{len(body)}"
              for path, body in files.items()]
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    project = index / name
    project.mkdir(parents=True, exist_ok=True)
    filename = f"{dist}-{tag}.whl"
    with zipfile.ZipFile(project / filename, "w") as whl:
        for path, body in files.items():
            whl.writestr(path, body)
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


@pytest.fixture
def indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A PyPI stand-in with torchvision's label-less build (as PyPI has for Linux: CUDA's), pip's own configuration
    pointed at it alone, and an empty torch index beside it."""
    if LABEL is None:
        pytest.skip(f"the worker's torch {TORCH} has no local version label: PyPI's builds are its own")
    pypi, torch_index = tmp_path / "pypi", tmp_path / "torch-index"
    torch_index.mkdir()
    _wheel(pypi, "torchvision", "0.28.0", [f"torch=={Version(TORCH).public}"])
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # none of this machine's indexes, links or constraints
    monkeypatch.setenv("PIP_INDEX_URL", pypi.as_uri() + "/")
    return pypi, torch_index


def _settings(tmp_path: Path, torch_index: Path | None) -> Settings:
    return Settings(runs_dir=tmp_path / "runs", venvs_dir=tmp_path / "venvs",  # type: ignore[call-arg]
                    torch_index_url=torch_index.as_uri() + "/" if torch_index else None)


def test_without_the_matching_build_the_job_is_refused_naming_package_found_and_needed(
        tmp_path: Path, indexes: tuple[Path, Path]) -> None:
    _, torch_index = indexes
    for index in (None, torch_index):  # no torch index known, and one that lacks the build
        with pytest.raises(venvs.SetupFailed) as refused:
            venvs.ensure(_settings(tmp_path, index), ["torchvision==0.28.0"], tmp_path / "requirements.log", lambda: True)
        said = str(refused.value)
        assert (f"torchvision 0.28.0 is compiled against torch and was found only as a build without a local version label "
                f"(PyPI's, built for CUDA on Linux) for torch {Version(TORCH).public}; this worker's torch is {TORCH}, which "
                f"needs torchvision 0.28.0+{LABEL}") in said, said
        assert "TORCH_INDEX_URL" in said
        assert [p.name for p in (tmp_path / "venvs").iterdir() if not p.name.endswith(".lock")] == []  # nothing kept


def test_the_build_of_the_workers_torch_comes_from_its_index(tmp_path: Path, indexes: tuple[Path, Path]) -> None:
    _, torch_index = indexes
    _wheel(torch_index, "torchvision", f"0.28.0+{LABEL}", [f"torch=={Version(TORCH).public}"])
    python = venvs.ensure(_settings(tmp_path, torch_index), ["torchvision==0.28.0"], tmp_path / "requirements.log", lambda: True)
    assert python is not None
    got = subprocess.run([python, "-c", "import torch, torchvision; print(torchvision.__version__, torch.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert got == [f"0.28.0+{LABEL}", TORCH]  # the worker's torch, untouched


def _entry(name: str, version: str, requires: list[str], wheel_tag: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": requires},
            "download_info": {"url": f"https://files.example/{name}-{version}-{wheel_tag}.whl"}}


labels = st.sampled_from([None, "cpu", "cu128", "cu126", "rocm6.4"])


@given(labels, labels, st.booleans(), st.booleans())
def test_only_a_platform_wheel_pinning_torch_with_another_label_is_a_mismatch(
        found: str | None, needed: str | None, platform: bool, pinned: bool) -> None:
    torch = "2.13.0" + (f"+{needed}" if needed else "")
    version = "0.28.0" + (f"+{found}" if found else "")
    entry = _entry("torchvision", version, ["torch==2.13.0" if pinned else "torch>=2.1", "numpy"],
                   "cp311-cp311-linux_x86_64" if platform else "py3-none-any")
    said = torch_builds.mismatches([entry], torch)
    assert bool(said) == (platform and pinned and found != needed)
    if said:
        assert said[0].startswith(f"torchvision {version} is compiled against torch")
        assert said[0].endswith(f"this worker's torch is {torch}, which needs torchvision 0.28.0" + (f"+{needed}" if needed else ""))


def test_the_torch_index_is_the_setting_else_what_the_install_recorded(tmp_path: Path) -> None:
    recorded = tmp_path / "torchyard-torch-index-url"
    plain = Settings(runs_dir=tmp_path / "runs")  # type: ignore[call-arg]
    assert torch_builds.index_url(plain, recorded) is None  # pip's configuration served torch
    recorded.write_text("https://mirror.example/whl/cpu\n")
    assert torch_builds.index_url(plain, recorded) == "https://mirror.example/whl/cpu"
    chosen = Settings(runs_dir=tmp_path / "runs", torch_index_url="https://download.pytorch.org/whl/cu128")  # type: ignore[call-arg]
    assert torch_builds.index_url(chosen, recorded) == "https://download.pytorch.org/whl/cu128"
