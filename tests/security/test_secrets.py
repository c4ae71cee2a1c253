"""Secrets reach the ranks' environment and nowhere else: no response, stream, log, runs-volume file,
Redis value or clear SQL column holds a value; a retry carries them over; the idempotency digest is
no offline oracle; and the job's processes cannot read the service's own environment."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

import jobspec.pdeathsig
from jobs.store.db import get_engine
from tests.helpers import wait_until
from tests.security.conftest import Live

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}


def wait_done(client: httpx.Client, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["status"] in TERMINAL else None

    return wait_until(done, 180, interval_s=0.3, what=f"job {job_id} to finish")


def environ_readable(pid: int, as_user: list[str] | None = None, python: str = sys.executable) -> bool:
    probe = [*(as_user or []), python, "-c", f"open('/proc/{pid}/environ', 'rb').read()"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_a_jobs_processes_cannot_read_the_services_environment(live: Live) -> None:
    """A job runs as the service's user; the API and the worker (which hold the database URL, the admin token
    and the secrets key) keep /proc/<pid>/environ from it, while ordinary processes of that user stay readable."""
    if os.geteuid() == 0:
        pytest.skip("running as root, which reads every process's environment; "
                    "test_not_dumpable_closes_environ_to_the_same_user shows the mechanism as an unprivileged user")
    ordinary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert environ_readable(ordinary.pid)
    finally:
        ordinary.kill()
        ordinary.wait()
    assert not environ_readable(live.services.api.pid)  # type: ignore[union-attr]
    assert not environ_readable(live.services.workers[0].pid)


def test_not_dumpable_closes_environ_to_the_same_user(tmp_path_factory: pytest.TempPathFactory) -> None:
    """jobspec.pdeathsig.set_not_dumpable, as the API, the worker and its work horses call it at start: a process of the
    same unprivileged user cannot read the caller's environment; without it, it can."""
    as_user: list[str] = []
    python = sys.executable
    if os.geteuid() == 0:
        setpriv, system_python = shutil.which("setpriv"), Path("/usr/bin/python3")
        if setpriv is None or not system_python.exists():
            pytest.skip("running as root without setpriv and /usr/bin/python3 to act as an unprivileged user")
        as_user, python = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"], str(system_python)
    work = Path(tempfile.mkdtemp(prefix="dumpable-"))
    work.chmod(0o755)
    (work / "pdeathsig.py").write_text((Path(jobspec.pdeathsig.__file__)).read_text())
    (work / "pdeathsig.py").chmod(0o644)
    target = ("import sys, time; sys.path.insert(0, {work!r}); import pdeathsig; "
              "assert {hide} is False or pdeathsig.set_not_dumpable(); print('ready', flush=True); time.sleep(60)")
    procs = {}
    try:
        for hide in (True, False):
            code = target.format(work=str(work), hide=hide)
            procs[hide] = subprocess.Popen([*as_user, python, "-c", code], stdout=subprocess.PIPE,
                                           env={"SERVICE_SETTING": "x"})
            assert procs[hide].stdout is not None and procs[hide].stdout.readline() == b"ready\n"
        assert not environ_readable(procs[True].pid, as_user, python)
        assert environ_readable(procs[False].pid, as_user, python)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        shutil.rmtree(work)


def everything_served(client: httpx.Client, job_id: str) -> dict[str, bytes]:
    """Every response a tenant (or its dashboard) can get about a finished job."""
    paths = [f"/v1/jobs/{job_id}", "/v1/jobs", "/v1/jobs?limit=500", f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/metrics",
             f"/v1/jobs/{job_id}/checkpoints", f"/v1/jobs/{job_id}/logs", f"/v1/jobs/{job_id}/logs?rank=0",
             f"/v1/jobs/{job_id}/logs?rank=0&stream=stdout", f"/v1/jobs/{job_id}/logs?rank=0&follow=true", "/metrics", "/",
             "/static/app.js", "/openapi.json"]
    served = {}
    for path in paths:
        resp = client.get(path)
        assert resp.status_code == 200, (path, resp.text)
        served[path] = resp.content
    return served


def test_secrets_reach_the_ranks_and_nothing_else(live: Live, short_api: str) -> None:
    values = {"WANDB_API_KEY": f"wandb-{secrets.token_hex(16)}", "HF_TOKEN": f"hf_{secrets.token_hex(16)}"}
    spec = {"kind": "script", "name": "with-secrets", "entrypoint": "report.py", "secrets": values,
            "env": {"APP_MODE": "probe", "NCCL_DEBUG": "WARN"}}
    with live.tenant("sam") as sam:
        created = sam.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "first"})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        assert created.json()["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"] and "secrets" not in created.json()["spec"]
        # The same request replays; the same key with another secret value is another request.
        replay = sam.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "first"})
        assert replay.json()["id"] == job_id and replay.headers["Idempotent-Replayed"] == "true"
        changed = {**spec, "secrets": {**values, "HF_TOKEN": "hf_other"}}
        assert sam.post("/v1/jobs", json=changed, headers={"Idempotency-Key": "first"}).status_code == 422

        job = wait_done(sam, job_id)
        assert job["status"] == "succeeded", job["error"]
        seen = json.loads((Path(job["run_dir"]) / "workdir" / "seen.json").read_text())
        assert seen["secret_digests"] == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in values.items()}
        assert seen["env"] == {"APP_MODE": "probe", "NCCL_DEBUG": "WARN"}
        # No database URL, admin token, Redis URL or secrets key in the ranks' environment, nor in torchrun's.
        assert seen["service_settings"] == [] and seen["launcher_service_settings"] == []
        # Rank processes: siblings import from the code root, the run directory is off sys.path, the parent-death signal is set,
        # and they start in the job's own copy of its code.
        assert (seen["sibling"], seen["run_dir_on_path"], seen["pdeathsig"]) == ("sibling module", False, signal.SIGKILL)
        assert seen["cwd"] == str(Path(job["run_dir"]).resolve() / "workdir")

        # A retry of the finished job runs with the same secrets, never shown either.
        retried = sam.post(f"/v1/jobs/{job_id}/retry")
        assert retried.status_code == 201, retried.text
        assert retried.json()["secrets"] == ["HF_TOKEN", "WANDB_API_KEY"]
        again = wait_done(sam, retried.json()["id"])
        assert again["status"] == "succeeded", again["error"]
        seen_again = json.loads((Path(again["run_dir"]) / "workdir" / "seen.json").read_text())
        assert seen_again["secret_digests"] == seen["secret_digests"]

        served = {**everything_served(sam, job_id), **{f"retry {k}": v for k, v in everything_served(sam, again["id"]).items()}}
        assert b"tick 0" not in served["/"]  # sanity: the dashboard page, not a job's output
        assert b"rank 0 reporting" in served[f"/v1/jobs/{job_id}/logs?rank=0"]
    with live.admin() as admin:
        served["admin detail"] = admin.get(f"/v1/jobs/{job_id}").content
        served["keys"] = admin.get("/v1/keys").content

    needles = [v.encode() for v in values.values()]
    for where, body in served.items():
        assert not any(n in body for n in needles), where
    for path in live.settings.runs_dir.rglob("*"):
        if path.is_file() and not path.is_symlink():
            content = path.read_bytes()
            assert not any(n in content for n in needles), path
    for path in live.services.logs.rglob("*.log"):
        content = path.read_bytes()
        assert not any(n in content for n in needles), path
    for needle in needles:
        assert live.redis_contains(needle) == []
    database = Path(live.settings.database_url.removeprefix("sqlite:///"))
    for path in database.parent.glob(database.name + "*"):  # the database, its WAL and journal
        content = path.read_bytes()
        assert not any(n in content for n in needles), path

    with get_engine(live.settings.database_url).connect() as conn:
        stored = conn.execute(sa.text("SELECT request_hash FROM idempotency_keys WHERE owner = 'sam'")).scalar_one()
        token = conn.execute(sa.text("SELECT token FROM job_secrets WHERE job_id = :j"), {"j": job_id}).scalar_one()
    # Not a plain digest of the request anyone holding the table could recompute for a guessed secret.
    visible = {k: v for k, v in created.json()["spec"].items()}
    for body in ({"spec": visible, "secrets": values}, {**visible, "secrets": values}):
        assert stored != hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert token.startswith("gAAAA")  # a Fernet token

    # An API without TORCHYARD_SECRETS_KEY refuses secrets rather than storing them in clear.
    with live.tenant("sam", url=short_api) as sam_elsewhere:
        before = live.job_rows("sam")
        resp = sam_elsewhere.post("/v1/jobs", json=spec)
        assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "secrets", resp.text
        assert live.job_rows("sam") == before
