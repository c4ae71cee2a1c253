"""The README's install, word for word (a fresh virtual environment, activated, then ``make install``), gives a
worker that reads the TensorBoard event files of a script that logs with ``torch.utils.tensorboard`` and lists
``tensorboard`` in its own ``requirements``: the job's metrics show its scalars. And a worker that cannot read
event files says so on the job, not only in its own log.

The README's environment takes several minutes to build (torch alone is hundreds of MB), so it is kept under
``TORCHYARD_TEST_CACHE`` (tests/env_cache.py) and reused by every later run on the machine, a fresh clone's included,
for as long as what decides its content is unchanged: the commands ``make install`` runs (the Makefile's install
targets, as make expands them), the service's and the client's pyproject.toml and the ``python3`` the venv is made
from. A change to any of them builds a new one the README's way. The checkout is not part of it: the worker imports
the service and the client from the checkout under test (``PYTHONPATH``), whichever checkout the environment's
editable installs name."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import env_cache
from tests.helpers import ROOT, Services

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter("runs/first")
    for step in range(1, 6):
        writer.add_scalar("loss", 1.0 / step, step)
    writer.close()
    print("logged 5 scalars", flush=True)
''')
# Event files the script wrote, and a worker whose tensorboard cannot be imported.
UNREADABLE = 'import os\nos.makedirs("runs", exist_ok=True)\nopen("runs/events.out.tfevents.1.host", "wb").write(b"x" * 64)\n'
NO_TENSORBOARD = 'raise ImportError("No module named \'tensorboard\' (hidden from this worker)")\n'


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def _readme_env() -> dict[str, str]:
    """The test's environment without its own virtual environment: a shell where the README's steps start."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("TORCHYARD_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix))
    return env


def install_key(root: Path, env: dict[str, str]) -> str:
    """What decides the environment's content: the commands ``make install`` runs (make expands the Makefile's
    install targets and their variables, so a change elsewhere in the Makefile builds nothing), pyproject.toml, and
    the ``python3`` the README's ``python3 -m venv`` finds."""
    commands = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(root), "install"], env=env,
                              capture_output=True, text=True, check=True).stdout
    python = subprocess.run(["python3", "-c", "import sys; print(sys.version, sys.base_prefix)"], env=env,
                            capture_output=True, text=True, check=True).stdout
    basis = [commands.encode(), (root / "pyproject.toml").read_bytes(), (root / "client" / "pyproject.toml").read_bytes(),
             python.encode()]
    return hashlib.sha256(b"\0".join(basis)).hexdigest()[:16]


@pytest.fixture(scope="session")
def readme_python() -> Iterator[str]:
    """The Python of an environment made as the README says: ``python3 -m venv .venv && . .venv/bin/activate &&
    make install``; built here unless an earlier run on this machine built it for the same key."""
    env = _readme_env()
    with env_cache.cached("readme-install", install_key(ROOT, env), lambda home: _build(home, env)) as home:
        yield str(home / ".venv" / "bin" / "python")


def _build(home: Path, env: dict[str, str]) -> str:
    """The README's install in the empty ``home``; returns the tail of what it printed."""
    done = subprocess.run(["bash", "-c", f"python3 -m venv .venv && . .venv/bin/activate && make -C {ROOT} install"],
                          cwd=home, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout[-2000:]


def _as(python: str) -> list[str]:
    """A ``wrap`` for Services that runs the service with ``python`` instead of the test's own interpreter."""
    return ["bash", "-c", 'shift; exec "$0" "$@"', python]


def _run_script(services: Services, script: str, requirements: list[str]) -> dict:
    (services.settings.code_dir / "train.py").write_text(script)
    with services.client() as client:
        created = client.post("/v1/jobs", json={"kind": "script", "name": "tb", "entrypoint": "train.py",
                                                "parallel": {"nproc_per_node": 1}, "requirements": requirements})
        assert created.status_code == 201, created.text
        job = services.wait_status(client, created.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=300)
        assert job["status"] == "succeeded", job["error"]
        job["loss"] = client.get(f"/v1/jobs/{job['id']}/metrics", params={"name": "loss"}).json()["items"]
    return job


@pytest.mark.timeout(2400)  # the first run builds the README's environment
def test_the_readme_install_shows_a_tensorboard_scripts_scalars(services: Services, readme_python: str) -> None:
    services.start_api()
    services.start_worker(wrap=_as(readme_python))
    job = _run_script(services, SCRIPT, ["tensorboard"])
    assert [(p["step"], round(p["value"], 3)) for p in job["loss"]] == [(1, 1.0), (2, 0.5), (3, 0.333), (4, 0.25), (5, 0.2)]
    assert job["transitions"][-1]["reason"] == "torchrun exited 0"


def test_a_worker_that_cannot_read_event_files_says_so_on_the_job(services: Services, tmp_path: Path) -> None:
    hidden = tmp_path / "hidden" / "tensorboard"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(NO_TENSORBOARD)
    services.start_api()
    services.start_worker(PYTHONPATH=os.pathsep.join([str(hidden.parent), str(ROOT), str(ROOT / "client")]))
    job = _run_script(services, UNREADABLE, [])
    assert job["loss"] == []
    said = job["transitions"][-1]["reason"]
    assert said.startswith("torchrun exited 0; warning: the job wrote TensorBoard event files "
                           "(workdir/runs/events.out.tfevents.1.host) but this worker cannot read them"), said
    assert "hidden from this worker" in said and "needs tensorboard" in said, said
