"""docker-compose.yml's api and worker, run natively: their commands and environment, read from the
compose file, against a real Redis and PostgreSQL, training a real 2-process DDP job.

Where no Docker engine runs (test_compose_real.py is then skipped), this still proves the wiring:
the database and Redis URLs the compose file builds, the settings both services get, the shared
runs volume, the API's image healthcheck and that the API runs without torch. Only what a container would change is rewritten:
service hostnames become the local servers, volume mount points become temporary directories
(one per named volume, shared by every service that mounts it), and `python` is this interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import sqlalchemy as sa

from stack.redis_server import free_port
from tests.deploy import composefile
from tests.deploy.composefile import ENV_EXAMPLE, ROOT
from tests.deploy.test_dockerfiles import API, BLOCK_TORCH, _final_stage
from tests.helpers import wait_for_api, wait_until

pytestmark = pytest.mark.slow

SPEC = {
    "name": "compose-native",
    "model": {"name": "mlp", "args": {"hidden": 32}},
    "data": {"name": "synthetic-classification", "args": {"samples": 512, "features": 16, "classes": 4}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2, "device": "cpu"},
    "train": {"epochs": 1, "global_batch_size": 64, "lr": 0.01, "log_every_steps": 2},
    "checkpoint": {"every_steps": 4},
}
TOKEN = "compose-native-token"


class ComposeService:
    """One compose service turned into a local process."""

    def __init__(self, name: str, compose: dict[str, Any], env: dict[str, str], volumes_root: Path, logs: Path):
        self.name, self.logs = name, logs / f"{name}.log"
        self.spec = composefile.interpolate_tree(compose["services"][name], env)
        # A named volume (or host path) per mount point; the same volume is the same directory for every service.
        self.mounts: dict[str, Path] = {}
        for entry in self.spec.get("volumes", []):
            source, target = entry.split(":")[:2]
            self.mounts[target] = volumes_root / source.strip("/").replace("/", "_")
            self.mounts[target].mkdir(parents=True, exist_ok=True)
        self.env = composefile.environment(self.spec)
        self.proc: subprocess.Popen[bytes] | None = None

    def host_path(self, container_path: str) -> str:
        for target, source in self.mounts.items():
            if container_path == target or container_path.startswith(target + "/"):
                return str(source) + container_path[len(target):]
        raise AssertionError(f"{self.name}: {container_path} is on no volume, so it would not survive the container")

    def start(self, command: list[str], env: dict[str, str], cwd: Path, extra_pythonpath: str = "") -> None:
        process_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
        process_env.update(env)
        process_env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_pythonpath, str(ROOT)) if p)
        cwd.mkdir(parents=True, exist_ok=True)
        self.logs.parent.mkdir(parents=True, exist_ok=True)
        with self.logs.open("ab") as out:
            self.proc = subprocess.Popen(command, env=process_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

    def stop(self, timeout_s: float) -> int | None:
        """What `docker compose stop` does: the stop signal, the grace period, then SIGKILL."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.Signals[self.spec.get("stop_signal", "SIGTERM")])
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def tail(self) -> str:
        text = self.logs.read_text(encoding="utf-8", errors="replace") if self.logs.exists() else ""
        return f"--- {self.name} log (last 4000 chars) ---\n{text[-4000:]}"


def _local_database(compose_url: str, local_url: str) -> str:
    """The compose URL with its server, user and database swapped for the local ones: the driver stays."""
    compose, local = sa.engine.make_url(compose_url), sa.engine.make_url(local_url)
    assert compose.drivername == "postgresql+psycopg" and compose.host == "postgres", compose_url
    moved = compose.set(host=local.host, port=local.port, username=local.username, password=local.password, database=local.database)
    return moved.render_as_string(hide_password=False)


def _local_redis(compose_url: str, local_url: str) -> str:
    compose, local = urlsplit(compose_url), urlsplit(local_url)
    assert compose.scheme == "redis" and compose.hostname == "redis", compose_url
    return urlunsplit(compose._replace(netloc=local.netloc))


def _localize_env(service: ComposeService, database_url: str, redis_url: str) -> dict[str, str]:
    env = dict(service.env)
    env["TORCHYARD_DATABASE_URL"] = _local_database(env["TORCHYARD_DATABASE_URL"], database_url)
    env["TORCHYARD_REDIS_URL"] = _local_redis(env["TORCHYARD_REDIS_URL"], redis_url)
    for key, value in env.items():
        if value.startswith("/var/lib/torchyard/"):
            env[key] = service.host_path(value)
    return env


def _api_command(command: list[str], host_port: int) -> list[str]:
    assert command[:3] == ["python", "-m", "api"], command
    args = [sys.executable, *command[1:]]
    # Listen where compose would publish the port, and only on loopback while testing.
    args[args.index("--port") + 1] = str(host_port)
    args[args.index("--host") + 1] = "127.0.0.1"
    return args


def _published_port(ports: list[str]) -> int:
    published = [p for p in ports if p.endswith(":8000")]
    assert len(published) == 1, ports
    return int(published[0].split(":")[-2])


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_compose_api_and_worker_train_a_job(tmp_path: Path, database_url: str, redis_url: str) -> None:
    compose = composefile.load()
    env = composefile.read_env_file(ENV_EXAMPLE)
    env.update(TORCHYARD_ADMIN_TOKEN=TOKEN, POSTGRES_PASSWORD="unused-locally", REDIS_PASSWORD="unused-locally",
               TORCHYARD_API_PORT=str(free_port()),
               TORCHYARD_MAX_NPROC_PER_NODE="2")
    volumes, logs = tmp_path / "volumes", tmp_path / "logs"
    api = ComposeService("api", compose, env, volumes, logs)
    worker = ComposeService("worker", compose, env, volumes, logs)
    port = _published_port(api.spec["ports"])
    base = f"http://127.0.0.1:{port}"

    # The api image has no torch: neither may the api process here.
    no_torch = tmp_path / "no-torch"
    no_torch.mkdir()
    (no_torch / "sitecustomize.py").write_text(BLOCK_TORCH, encoding="utf-8")

    try:
        api.start(_api_command(api.spec["command"], port), _localize_env(api, database_url, redis_url), tmp_path / "api-home",
                  extra_pythonpath=str(no_torch))

        assert api.proc is not None
        wait_for_api(api.proc, base, api.logs)
        # The image's own HEALTHCHECK command, pointed at this port, is what compose's depends_on waits on.
        healthcheck = json.loads(next(a for op, a in _final_stage(API) if op == "HEALTHCHECK").split("CMD", 1)[1])
        healthcheck = [sys.executable if a == "python" else a.replace("127.0.0.1:8000/", f"127.0.0.1:{port}/") for a in healthcheck]
        assert subprocess.run(healthcheck, timeout=30).returncode == 0

        # Natively there is no container user to drop from (compose's setpriv entrypoint): the worker runs as this
        # process's user, and jobs with it (job uids are tried in tests/security/test_job_isolation.py).
        worker_command = [sys.executable if a == "python" else a for a in worker.spec["command"]]
        worker_env = {k: v for k, v in _localize_env(worker, database_url, redis_url).items() if k != "TORCHYARD_JOB_UIDS"}
        worker.start(worker_command, worker_env, tmp_path / "worker-home")

        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            created = client.post("/v1/jobs", json=SPEC)
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            assert created.json()["status"] == "queued"

            def finished() -> dict[str, Any] | None:
                if worker.proc and worker.proc.poll() is not None:
                    raise AssertionError(f"the worker exited with {worker.proc.returncode}\n{worker.tail()}")
                job = client.get(f"/v1/jobs/{job_id}").json()
                return job if job["status"] in {"succeeded", "failed", "cancelled"} else None

            job = wait_until(finished, 180, interval_s=0.5, what=f"job {job_id} to finish")
            assert job["status"] == "succeeded", f"{job.get('error')}\n{worker.tail()}"

            # The worker wrote the checkpoints into the runs volume; the API lists them from the same volume.
            checkpoints = client.get(f"/v1/jobs/{job_id}/checkpoints").json()["items"]
            assert checkpoints, "no checkpoint recorded"
            runs = api.mounts["/var/lib/torchyard/runs"]
            assert runs == worker.mounts["/var/lib/torchyard/runs"]
            last = Path(checkpoints[-1]["path"])
            assert last.is_dir() and runs.resolve() in last.resolve().parents, last

        # An idle worker leaves promptly on the stop signal, well inside its grace period.
        grace = composefile.duration_seconds(worker.spec["stop_grace_period"])
        assert worker.stop(grace) == 0, worker.tail()
    except BaseException:
        sys.stderr.write(api.tail() + "\n" + worker.tail() + "\n")
        raise
    finally:
        worker.stop(30)
        api.stop(30)
