"""`kind: script` jobs end to end: the API and a worker as processes, real torchrun, two gloo ranks
running the example scripts from the code root; and the path and env attacks refused at POST."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from jobs.store.db import get_engine
from jobs.store.models import Job
from tests.helpers import ROOT, Services
from worker.sandbox.processes import marked_processes

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples" / "scripts"
STEPS_PER_EPOCH = 8  # 512 samples / 2 ranks / batch 32


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture
def code_dir(services: Services) -> Path:
    code = services.settings.code_dir
    for script in ("ddp_tutorial_sdk.py", "ddp_plain.py"):
        shutil.copy(EXAMPLES / script, code / script)
    return code


def script_spec(name: str, entrypoint: str, args: list[str], **extra: Any) -> dict[str, Any]:
    return {"kind": "script", "name": name, "entrypoint": entrypoint, "args": args, "parallel": {"nproc_per_node": 2}, **extra}


def rank_logs(run_dir: Path, attempt: int) -> str:
    files = sorted((run_dir / "logs" / f"attempt-{attempt}").rglob("*.log"))
    return "\n".join(f.read_text(errors="replace") for f in files)


def test_sdk_script_reports_metrics_and_checkpoints_and_resumes_on_retry(services: Services, code_dir: Path) -> None:
    services.start_api()
    services.start_worker()
    spec = script_spec("ddp-sdk", "ddp_tutorial_sdk.py", ["4", "1"], retries=1,
                       env={"APP_CRASH_AT_EPOCH": "2"})  # the first attempt crashes after two snapshots
    with services.client() as client:
        created = client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        assert created.json()["kind"] == "script"

        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        assert job["attempt"] == 2  # one failed attempt, one retry
        run_dir = Path(job["run_dir"])
        assert "simulated crash" in rank_logs(run_dir, 1)
        assert "Resuming training from snapshot at Epoch 2 (step 16)" in rank_logs(run_dir, 2)

        total = 4 * STEPS_PER_EPOCH
        assert job["last_step"] == total
        losses = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()["items"]
        assert [m["step"] for m in losses] == list(range(1, total + 1))  # continuous, no duplicates
        assert losses[-1]["value"] < losses[0]["value"] * 0.5

        checkpoints = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
        assert [c["step"] for c in checkpoints] == [8, 16, 24, 32]
        assert all(Path(c["path"]).is_file() for c in checkpoints)
        assert Path(checkpoints[-1]["path"]) == run_dir / "workdir" / "snapshots" / "epoch_0004.pt"  # relative to its copy

    # The retry resumed rather than starting over: no step was ever reported twice, and seq kept increasing.
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    metric_steps = [e["step"] for e in events if e["type"] == "metric"]
    assert sorted(metric_steps) == list(range(1, total + 1))
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))
    assert marked_processes(job_id) == []


def test_plain_script_runs_unchanged_and_its_exit_code_decides(services: Services, code_dir: Path) -> None:
    services.start_api()
    services.start_worker()
    with services.client() as client:
        good = client.post("/v1/jobs", json=script_spec("ddp-plain", "ddp_plain.py", ["2", "1"]))
        # One rank is enough to show a failing exit code failing the job, and costs one interpreter less.
        bad = client.post("/v1/jobs", json=script_spec("ddp-plain-bad", "ddp_plain.py", ["two", "1"], parallel={"nproc_per_node": 1}))
        assert good.status_code == 201, good.text
        assert bad.status_code == 201, bad.text

        job = services.wait_status(client, good.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        run_dir = Path(job["run_dir"])
        logs = rank_logs(run_dir, 1)
        assert "[rank 0] Epoch 1" in logs and "[rank 1] Epoch 1" in logs  # both ranks' output captured
        assert (run_dir / "workdir" / "snapshot.pt").is_file()  # relative paths land in the job's copy of its code
        assert client.get(f"/v1/jobs/{job['id']}/metrics").json()["items"] == []  # it reports nothing, and needs not

        failed = services.wait_status(client, bad.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert failed["status"] == "failed"
        assert failed["error"]["exit_code"] not in (None, 0)
        assert "invalid int value: 'two'" in rank_logs(Path(failed["run_dir"]), 1)
        # A plain script leaves torchrun no error file: the job's error quotes the failing rank's own output.
        assert "invalid int value: 'two'" in failed["error"]["log_tail"]


def test_path_and_env_attacks_are_refused_and_nothing_runs(services: Services, tmp_path: Path) -> None:
    code = services.settings.code_dir
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').write('ran')\n"
    (outside / "evil.py").write_text(evil)
    (outside / "evilpkg").mkdir()
    (outside / "evilpkg" / "__init__.py").write_text(evil)
    (outside / "evilpkg" / "train.py").write_text(evil)
    (code / "ok.py").write_text("pass\n")
    (code / "escape.py").symlink_to(outside / "evil.py")
    (code / "linkdir").symlink_to(outside)
    (code / "evilpkg").symlink_to(outside / "evilpkg")

    attacks: list[tuple[dict[str, Any], str]] = [
        ({"entrypoint": "../outside/evil.py"}, "entrypoint"),
        ({"entrypoint": "ok/../../outside/evil.py"}, "entrypoint"),
        ({"entrypoint": str(outside / "evil.py")}, "entrypoint"),
        ({"entrypoint": "escape.py"}, "entrypoint"),
        ({"entrypoint": "linkdir/evil.py"}, "entrypoint"),
        ({"entrypoint": "evilpkg.train"}, "entrypoint"),
        ({"entrypoint": "runpy"}, "entrypoint"),
        ({"entrypoint": "trainer"}, "entrypoint"),
        ({"entrypoint": "missing.py"}, "entrypoint"),
        ({"env": {"LD_PRELOAD": str(outside / "evil.so")}}, "env.LD_PRELOAD"),
        ({"env": {"PYTHONPATH": str(outside)}}, "env.PYTHONPATH"),
        ({"env": {"PYTHONSTARTUP": str(outside / "evil.py")}}, "env.PYTHONSTARTUP"),
        ({"env": {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}}, "env.TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"),
        ({"env": {"TORCHYARD_JOB_ID": "someone-else"}}, "env.TORCHYARD_JOB_ID"),
        ({"env": {"MASTER_PORT": "1"}}, "env.MASTER_PORT"),
        ({"args": "--epochs 3; rm -rf /"}, "args"),
        ({"kind": "shell"}, "kind"),
    ]
    services.start_api()
    with services.client() as client:
        for change, field in attacks:
            spec = {**script_spec("attack", "ok.py", []), **change}
            resp = client.post("/v1/jobs", json=spec)
            assert resp.status_code == 422, (change, resp.text)
            assert resp.headers["content-type"].startswith("application/problem+json")
            assert field in [e["field"] for e in resp.json()["errors"]], (change, resp.json())
        assert client.get("/v1/jobs").json()["items"] == []
        # The same spec without the attack is accepted: the refusals were about the attacks alone.
        assert client.post("/v1/jobs", json=script_spec("fine", "ok.py", [], parallel={"nproc_per_node": 1})).status_code == 201
    # Only the accepted job is queued, and no attack's code ever ran.
    with Session(get_engine(services.settings.database_url)) as s:
        assert s.exec(sa.select(sa.func.count()).select_from(Job).where(Job.status == "queued")).one()[0] == 1
    assert not marker.exists()


def test_a_script_for_torch_distributed_launch_gets_its_local_rank_argument(services: Services) -> None:
    """``--local_rank=${local_rank}`` in args: torchrun puts each rank's own local rank there, as
    torch.distributed.launch passed it. Without it such a script trains alone on every rank, and the job says so."""
    shutil.copy(ROOT / "tests" / "worker" / "data" / "launch_local_rank.py", services.settings.code_dir / "legacy.py")
    services.start_api()
    services.start_worker()
    with services.client() as client:
        given = client.post("/v1/jobs", json=script_spec("legacy-arg", "legacy.py", ["--local_rank=${local_rank}"])).json()["id"]
        alone = client.post("/v1/jobs", json=script_spec("legacy", "legacy.py", [])).json()["id"]
        job = services.wait_status(client, given, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        logs = rank_logs(Path(job["run_dir"]), 1)
        assert "[rank 0] local_rank 0 of world 2 epoch 1" in logs and "[rank 1] local_rank 1 of world 2 epoch 1" in logs
        assert job["transitions"][-1]["reason"] == "torchrun exited 0"  # one process group of 2: no warning

        job = services.wait_status(client, alone, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        assert "[rank 1] local_rank -1 of world 1 epoch 1" in rank_logs(Path(job["run_dir"]), 1)
        said = job["transitions"][-1]["reason"]
        assert "never formed a process group" in said and "--local_rank=${local_rank}" in said, said
