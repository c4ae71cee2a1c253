"""Bundles that pass for torchyard's own modules, run as real jobs: a live API and worker, real torchrun.

A bundle holding ``trainer/rank_bootstrap.py``, run as that module with a nested bootstrap's args, made the
rank run torchyard's installed bootstrap on them, and so any command (``dotenv run -- sh -c id``); now it runs
the bundle's own file. A user's own top-level ``trainer.py`` is the module its script imports."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers import Services
from torchyard.client import Client

pytestmark = pytest.mark.slow

NESTED_ARGS = ["/x", "module", "dotenv", "--file", "/etc/hostname", "run", "--", "sh", "-c", "id"]


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run_from(key: str, services: Services, workdir: Path, entrypoint: str, args: list[str]) -> tuple[str, str]:
    """Submit a one-rank script job from ``workdir`` as a user does (the client packs and uploads it); its final
    status and rank 0's log."""
    with Client(services.url, key) as client:
        job = client.submit({"kind": "script", "name": workdir.name, "entrypoint": entrypoint, "args": args,
                             "parallel": {"nproc_per_node": 1}}, workdir=workdir)
    with httpx.Client(base_url=services.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as tenant:
        status = services.wait_status(tenant, job.id, {"succeeded", "failed", "cancelled"}, timeout_s=180)["status"]
        return status, tenant.get(f"/v1/jobs/{job.id}/logs", params={"rank": 0}).text


def test_a_bundle_cannot_pass_for_the_bootstrap_and_a_users_trainer_module_is_its_own(services: Services, tmp_path: Path) -> None:
    services.start_api()
    services.start_worker()
    with services.client() as admin:
        key = admin.post("/v1/keys", json={"owner": "mallory", "name": "attacker"}).json()["key"]
    shadow = write(tmp_path / "shadow", {
        "trainer/__init__.py": "",
        "trainer/rank_bootstrap.py": "import sys\nprint('the bundle file ran with', sys.argv[1:], flush=True)\n",
    })
    status, log = run_from(key, services, shadow, "trainer.rank_bootstrap", NESTED_ARGS)
    assert status == "succeeded", log
    assert f"the bundle file ran with {NESTED_ARGS}" in log and "uid=" not in log, log

    own = write(tmp_path / "own", {
        "trainer.py": "class Trainer:\n    def fit(self) -> str:\n        return 'fitted by the user'\n",
        "train.py": "from trainer import Trainer\nprint(Trainer().fit(), flush=True)\n",
    })
    status, log = run_from(key, services, own, "train.py", [])
    assert status == "succeeded" and "fitted by the user" in log, log
