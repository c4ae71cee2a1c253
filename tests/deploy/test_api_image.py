"""The api image's Python environment, built without Docker: the project wheel installed with
--no-deps over docker/requirements.txt in a fresh virtual environment that has no torch, as
docker/api.Dockerfile does. It must start, migrate its database and accept a job.

The environment with docker/requirements.txt installed is built once per machine and requirements file
(tests/env_cache.py, 40 CPU-seconds of pip) and copied for each run, which then installs this checkout's wheels
into the copy as the Dockerfile's second step does.

This catches what reading the Dockerfile cannot: a runtime dependency missing from
docker/requirements.txt, a module or data file missing from the wheel, an import of torch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from stack.redis_server import free_port
from tests import env_cache
from tests.deploy.composefile import ROOT
from tests.deploy.test_dockerfiles import API, _instructions
from tests.helpers import wait_for_api

pytestmark = pytest.mark.slow

SPEC = {
    "name": "api-image",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 256}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 1, "global_batch_size": 32},
}


def _run(args: list[str], **kwargs: object) -> None:
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{' '.join(args)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def _build_context(src: Path) -> Path:
    """What the Dockerfile's build stage COPYs, and nothing else: a package the api needs but the
    Dockerfile does not copy is missing here too."""
    instructions = _instructions(API)
    second_from = [i for i, (op, _) in enumerate(instructions) if op == "FROM"][1]
    for op, args in instructions[:second_from]:
        if op != "COPY":
            continue
        *sources, dest = args.split()
        for source in sources:
            # "COPY a b ./" puts a and b into the directory; "COPY api ./api" names the target.
            target = src / Path(source).name if dest.endswith("/") or dest == "." else src / dest
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / source, target)
    return src


def _requirements_key() -> str:
    """What decides the requirements environment's content: the file, and the interpreter its venv is made from."""
    basis = [(ROOT / "docker" / "requirements.txt").read_bytes(), f"{sys.version} {sys.base_prefix}".encode()]
    return hashlib.sha256(b"\0".join(basis)).hexdigest()[:16]


def _install_requirements(home: Path) -> str:
    """A fresh venv in ``home`` with docker/requirements.txt installed, as the Dockerfile's first pip step."""
    _run([sys.executable, "-m", "venv", str(home / "venv")])
    _run([str(home / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "-r", str(ROOT / "docker" / "requirements.txt")])
    return "docker/requirements.txt installed"


@pytest.mark.timeout(1800)  # the first run on a machine installs the API's requirements in a fresh venv: minutes at load
def test_api_environment_without_torch_serves(tmp_path: Path, redis_url: str) -> None:
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    context = _build_context(tmp_path / "src")
    # The service and its client, as the Dockerfile's `pip wheel --no-deps . ./client`.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(context), str(context / "client")])
    with env_cache.cached("api-requirements", _requirements_key(), _install_requirements) as home:
        # A copy: the wheels below go into this run's environment, never into the one later runs start from. Its
        # python is a link to the base interpreter and finds its site-packages beside pyvenv.cfg, so the copy is whole.
        shutil.copytree(home / "venv", venv, symlinks=True)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", *map(str, wheels.glob("*.whl"))])
    _run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"])
    # Nothing the service requires is missing but torch, by design: the client it requires by path is installed.
    checked = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert [line for line in checked.stdout.splitlines() if "requires torch," not in line] == [], checked.stdout

    port = free_port()
    # Nothing of the repository on the path: only what the wheel installed.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHYARD_", "PYTHON"))}
    env.update({
        "TORCHYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'db' / 'torchyard.db'}",
        "TORCHYARD_REDIS_URL": redis_url,
        "TORCHYARD_RUNS_DIR": str(tmp_path / "runs"),
        "TORCHYARD_DATA_DIR": str(tmp_path / "data"),
        "TORCHYARD_CODE_DIR": str(tmp_path / "code"),
        "TORCHYARD_ADMIN_TOKEN": "image-token",
        "TORCHYARD_MAX_NPROC_PER_NODE": "2",
    })
    home = tmp_path / "home"
    home.mkdir()
    log_path = tmp_path / "api.log"
    with log_path.open("wb") as log_file:
        api = subprocess.Popen([python, "-m", "api", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=home,
                               stdout=log_file, stderr=subprocess.STDOUT)
    try:
        wait_for_api(api, f"http://127.0.0.1:{port}", log_path)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer image-token"}, timeout=30) as client:
            created = client.post("/v1/jobs", json=SPEC)
            assert created.status_code == 201, created.text
            assert client.get(f"/v1/jobs/{created.json()['id']}").json()["status"] == "queued"
            refused = client.post("/v1/jobs", json={**SPEC, "model": {"name": "no-such-model"}})
            assert refused.status_code == 422 and "model.name" in refused.text
    finally:
        api.terminate()
        api.wait(30)
