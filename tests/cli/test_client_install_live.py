"""``pip install torchyard`` as a user does it, into a fresh virtual environment (not this test's) from this
checkout's client/: the client and nothing of the service (no torch, no api/jobs/worker..., one top-level name),
whose ``torchyard`` command logs in to a live service, submits a job and follows it, as ``Client`` does too; and a
project environment that already has its own torch keeps that torch.

The environments install with ``--no-index`` from a wheelhouse built once for the module: the client's wheel
from the checkout and its dependencies' wheels (from pip's cache after the first run)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, Services

pytestmark = pytest.mark.slow

SPEC = {
    "name": "laptop-client",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 256, "features": 8, "classes": 4}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 1},
    "train": {"epochs": 1, "global_batch_size": 32, "log_every_steps": 2},
}
SERVICE = ["api", "jobs", "worker", "trainer", "stack", "manifests", "dashboard", "client", "cli", "torch", "fastapi", "sqlmodel"]
CLIENT_PROBE = """
import json, sys
from torchyard import Client
with Client.from_config() as client:
    job = client.submit(sys.argv[1])
    done = client.wait(job.id, timeout=600)
    losses = client.metrics(job.id, "train/loss")
print(json.dumps({"id": job.id, "status": done.status, "losses": len(losses)}))
"""
REPORT_PROBE = """
import json, sys
from torchyard import report
report.metrics(1, loss=0.5)
report.close()
torch = sys.modules.get("torch")
print(json.dumps({"torch": getattr(torch, "__version__", None)}))
"""


def _env(**extra: str) -> dict[str, str]:
    """A shell of the user's: nothing of this test's environment, the checkout or the service's settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("TORCHYARD_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix))
    return {**env, **extra}


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)], cwd=path.parent)
    return path / "bin"


def _installed(bin_dir: Path) -> dict[str, str]:
    out = _run([str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"], cwd=bin_dir).stdout
    return {d["name"].lower(): d["version"] for d in json.loads(out)}


def _install_client(bin_dir: Path, wheelhouse: Path) -> None:
    _run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheelhouse), "torchyard"],
         cwd=bin_dir)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(out), str(ROOT / "client")], cwd=out)
    return out


def _fake_torch_wheel(directory: Path, version: str) -> Path:
    """A distribution named torch, as a project's own (older) torch would be installed: enough for pip to see it."""
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.mark.timeout(1200)
def test_the_client_install_has_no_service_and_drives_a_live_one(services: Services, wheelhouse: Path, tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "laptop")
    _install_client(bin_dir, wheelhouse)
    installed = _installed(bin_dir)
    assert "torchyard" in installed
    assert not {"torch", "torchyard-server", "fastapi", "sqlmodel", "uvicorn", "alembic", "rq"} & set(installed), installed
    # One top-level name in site-packages (besides its metadata and the console script).
    owned = _run([str(bin_dir / "python"), "-c", "import importlib.metadata as m, json; "
                  "print(json.dumps(sorted({f.parts[0] for f in m.distribution('torchyard').files})))"], cwd=tmp_path).stdout
    assert [p for p in json.loads(owned) if p != ".." and not p.endswith(".dist-info")] == ["torchyard"]
    probe = "import importlib, json\nfor name in " + repr(SERVICE) + ":\n    try:\n        importlib.import_module(name)\n" \
            "        print(name)\n    except ImportError:\n        pass\n"
    assert _run([str(bin_dir / "python"), "-c", probe], cwd=tmp_path).stdout.split() == []

    helped = _run([str(bin_dir / "torchyard"), "--help"], cwd=tmp_path)
    assert "Usage: torchyard" in helped.stdout and "submit" in helped.stdout
    up = subprocess.run([str(bin_dir / "torchyard"), "up"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert up.returncode != 0 and "pip install torchyard-server" in up.stderr, up.stderr

    # The SDK without torch: a script run by hand under a job's run directory reports, and imports no torch.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reported = _run([str(bin_dir / "python"), "-c", REPORT_PROBE], cwd=tmp_path, env=_env(TORCHYARD_RUN_DIR=str(run_dir)))
    assert json.loads(reported.stdout.splitlines()[-1]) == {"torch": None}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["type"] == "metric" and e["values"] == {"loss": 0.5} for e in events)

    services.start_api()
    services.start_worker()
    config = tmp_path / "home" / "config.toml"
    user = _env(TORCHYARD_CONFIG=str(config), HOME=str(tmp_path / "home"))
    key = services.headers["Authorization"].removeprefix("Bearer ")
    login = _run([str(bin_dir / "torchyard"), "login", "--url", services.url, "--key", key, "--json"], cwd=tmp_path, env=user)
    assert json.loads(login.stdout) == {"config": str(config), "url": services.url, "verified": True}

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    followed = _run([str(bin_dir / "torchyard"), "submit", str(spec), "--follow"], cwd=tmp_path, env=user)
    job_id = followed.stdout.split()[1]  # "submitted <id> (name), queued ..."
    assert f"{job_id} succeeded" in followed.stdout, followed.stdout
    status = _run([str(bin_dir / "torchyard"), "status", job_id, "--json"], cwd=tmp_path, env=user)
    assert json.loads(status.stdout)["status"] == "succeeded"

    done = _run([str(bin_dir / "python"), "-c", CLIENT_PROBE, str(spec)], cwd=tmp_path, env=user)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["status"] == "succeeded" and result["losses"] > 0, result
    assert result["id"] != job_id


def test_a_project_keeps_its_own_torch(wheelhouse: Path, tmp_path: Path) -> None:
    wheels = tmp_path / "theirs"
    wheels.mkdir()
    _fake_torch_wheel(wheels, "2.5.0")
    bin_dir = _venv(tmp_path / "project")
    _run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels), "torch==2.5.0"],
         cwd=tmp_path)
    _install_client(bin_dir, wheelhouse)
    installed = _installed(bin_dir)
    assert installed["torch"] == "2.5.0" and "torchyard" in installed and "torchyard-server" not in installed
    # The SDK runs beside that torch.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reported = _run([str(bin_dir / "python"), "-c", "import torch\n" + REPORT_PROBE], cwd=tmp_path,
                    env=_env(TORCHYARD_RUN_DIR=str(run_dir)))
    assert json.loads(reported.stdout.splitlines()[-1]) == {"torch": "2.5.0"}
    assert "metric" in (run_dir / "events.jsonl").read_text()

