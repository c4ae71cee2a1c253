"""pyproject.toml is the one source of the pins; the images' files must agree with it. The client's own
pyproject.toml (client/) asks for ranges, which the service's pins must satisfy."""

from __future__ import annotations

import re
import sys

import pytest
from packaging.requirements import Requirement

from tests.deploy.composefile import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def _name(requirement: str) -> str:
    """The normalized project name (PEP 503) of a requirement line."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]).lower()


def _normalized(requirement: str) -> str:
    """The requirement with its project name normalized, so "PyYAML==6" and "pyyaml==6" compare equal."""
    name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]
    return _name(name) + requirement[len(name):].replace(" ", "")


def _pyproject(path: str = "pyproject.toml") -> dict:
    with (ROOT / path).open("rb") as f:
        return tomllib.load(f)["project"]


def _pyproject_dependencies() -> list[str]:
    """The service's pinned dependencies: all but the client, which it takes from this checkout by path."""
    return [d for d in _pyproject()["dependencies"] if _name(d) != "torchyard"]


def _docker_requirements() -> list[str]:
    lines = (ROOT / "docker" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_docker_requirements_equal_pyproject_without_torch() -> None:
    expected = {_normalized(d) for d in _pyproject_dependencies() if _name(d) != "torch"}
    actual = set(map(_normalized, _docker_requirements()))
    assert actual == expected, (
        "docker/requirements.txt must list exactly pyproject.toml's dependencies except torch; "
        f"only in pyproject.toml: {sorted(expected - actual)}, only in docker/requirements.txt: {sorted(actual - expected)}"
    )


def test_worker_requirements_equal_the_worker_extra() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["worker"]
    lines = (ROOT / "docker" / "worker-requirements.txt").read_text(encoding="utf-8").splitlines()
    actual = {_normalized(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#")}
    assert actual == {_normalized(d) for d in extra}
    assert all("==" in d for d in extra), "images are only reproducible with exact pins"


def test_every_dependency_is_pinned() -> None:
    loose = [d for d in _pyproject_dependencies() if "==" not in d]
    assert loose == [], "images are only reproducible with exact pins"


def test_the_service_takes_the_client_from_this_checkout() -> None:
    assert "torchyard @ {root:uri}/client" in _pyproject()["dependencies"]
    assert _pyproject("client/pyproject.toml")["name"] == "torchyard"


def test_the_client_asks_for_no_torch_and_its_ranges_hold_the_service_pins() -> None:
    client = _pyproject("client/pyproject.toml")
    asked = [Requirement(r) for r in [*client["dependencies"], *sum(client["optional-dependencies"].values(), [])]]
    assert not {r.name for r in asked} & {"torch", "torchyard-server", "fastapi", "sqlmodel"}
    pins = {_name(d): Requirement(d) for d in [*_pyproject_dependencies(), *sum(_pyproject()["optional-dependencies"].values(), [])]}
    for requirement in asked:
        pin = pins.get(_name(requirement.name))
        assert pin is not None, f"the service does not pin the client's {requirement.name}"
        version = str(pin.specifier).removeprefix("==")
        assert requirement.specifier.contains(version), f"the service pins {pin}, outside the client's {requirement}"


def test_worker_torch_pin_equals_pyproject() -> None:
    torch_pin = next(d for d in _pyproject_dependencies() if _name(d) == "torch").split("==", 1)[1]
    dockerfile = (ROOT / "docker" / "worker.Dockerfile").read_text(encoding="utf-8")
    assert f"ARG TORCH_VERSION={torch_pin}\n" in dockerfile
