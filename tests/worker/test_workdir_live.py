"""A script sent with ``--workdir`` runs as ``python train.py`` would in the user's checkout: it reads its config
relative to its root, writes beside its own files, and its next attempt finds what it wrote; those files are the
job's artifacts, the uploaded ones are not. A live API and worker, real torchrun."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from tests.helpers import Services
from tests.worker.test_bundle_jobs import write
from torchyard.client import Client

pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path

    config = json.loads(open("config/run.json").read())  # relative to the repository's root, as users write it
    state = Path(__file__).parent / "state.txt"  # beside the script itself
    attempt = os.environ["TORCHYARD_ATTEMPT"]
    if not state.exists():
        state.write_text(f"written by attempt {attempt} with lr {config['lr']}")
        print("no state yet; failing so the job retries", flush=True)
        sys.exit(3)
    print(f"attempt {attempt} found: {state.read_text()}", flush=True)
''')


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_a_script_reads_its_config_writes_beside_itself_and_finds_it_again(services: Services, tmp_path: Path) -> None:
    services.start_api()
    services.start_worker()
    with services.client() as admin:
        key = admin.post("/v1/keys", json={"owner": "ada", "name": "ada"}).json()["key"]
    repo = write(tmp_path / "repo", {"train.py": TRAIN, "config/run.json": '{"lr": 0.25}'})
    with Client(services.url, key) as client:
        job = client.submit({"kind": "script", "name": "repo", "entrypoint": "train.py", "retries": 1,
                             "parallel": {"nproc_per_node": 1}}, workdir=repo)
    with httpx.Client(base_url=services.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as tenant:
        done = services.wait_status(tenant, job.id, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        log = tenant.get(f"/v1/jobs/{job.id}/logs", params={"rank": 0}).text
        assert (done["status"], done["attempt"]) == ("succeeded", 2), (done["error"], log)
        assert "attempt 2 found: written by attempt 1 with lr 0.25" in log, log
        listed = [i["path"] for i in tenant.get(f"/v1/jobs/{job.id}/artifacts").json()["items"]]
        assert listed == ["workdir/state.txt"], listed
        got = tenant.get(f"/v1/jobs/{job.id}/artifacts/workdir/state.txt")
        assert got.text == "written by attempt 1 with lr 0.25"
    run_dir = Path(done["run_dir"])
    assert (run_dir / "logs" / "attempt-2").is_dir() and not (run_dir / "code" / "state.txt").exists()
    assert not (run_dir / "workdir" / "logs").exists()  # logs and events stay in the run directory
