"""``torchyard quota`` and priorities in the CLI, against a real API."""

from __future__ import annotations

from tests.cli.conftest import cli
from tests.helpers import Services


def test_the_admin_sets_quotas_and_ls_shows_priorities(services: Services) -> None:
    services.start_api()
    code, out = cli(services, "quota")
    assert code == 0 and "no quotas set" in out, out
    code, out = cli(services, "quota", "set", "alice", "--gpus", "4")
    assert code == 0 and "owner alice: 4 GPUs, no limit CPU slots guaranteed" in out, out
    code, out = cli(services, "quota")
    row = next(line.split() for line in out.splitlines() if line.startswith("alice"))
    assert row == ["alice", "0", "4", "0", "0", "no", "limit"], out
    code, out = cli(services, "keys", "create", "--owner", "bob", "--name", "ci", "--max-priority", "70", "--json")
    assert code == 0 and '"max_priority": 70' in out, out
    (services.settings.code_dir / "train.py").write_text("pass\n")
    with services.client() as client:
        job = client.post("/v1/jobs", json={"kind": "script", "name": "urgent", "entrypoint": "train.py", "priority": 90}).json()
    code, out = cli(services, "ls")
    assert code == 0 and any(line.split()[:4] == [job["id"], "urgent", "queued", "90"] for line in out.splitlines()), out
    code, out = cli(services, "status", job["id"])
    assert code == 0 and "priority" in out and "90" in out, out
    code, out = cli(services, "quota", "rm", "alice")
    assert code == 0 and "quota removed" in out
