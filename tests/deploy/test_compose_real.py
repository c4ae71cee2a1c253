"""`docker compose up` for real: both images built from this repository, the CPU stack started with
`up --wait` under its own project name on a free port, and the things an operator does to it.

One stack serves every test of the module, in order: the README's GPU quick-start job (on the CPU
override), a code bundle uploaded and run as a script job, a worker stopped and started mid-job,
PostgreSQL and Redis restarted mid-job, a 2-node job across two worker containers, and `down`
(volumes kept) then `up`. At the end the stack is torn down with its volumes, also when a test failed.

Needs a Docker engine with the Compose v2 plugin; skipped when none answers. On a machine that
cannot pull public images, ../shared/docker-standins/setup.sh provides the engine and the base
images (.ci/run calls it). Durations (build, `up` to healthy, POST to succeeded) are logged at
INFO: `pytest tests/deploy/test_compose_real.py -o log_cli=true --log-cli-level=INFO`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.redis_server import free_port
from tests.deploy import composefile
from tests.deploy.composefile import COMPOSE_FILE, CPU_OVERRIDE, ENV_EXAMPLE, ROOT
from tests.helpers import wait_until

# The first test builds both images: minutes when no layer is cached.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll would bury the timings

README = ROOT / "README.md"
RUNS = "/var/lib/torchyard/runs"
TERMINAL = {"succeeded", "failed", "cancelled"}
# What a test changes in .env to run fast and privately: a loopback port, short lease and stop
# windows, a small /dev/shm (the default 16 GB is a limit, but a test should not ask for it).
TEST_SETTINGS = {
    "TORCHYARD_API_BIND": "127.0.0.1",
    "TORCHYARD_LEASE_TTL_S": "15",
    "TORCHYARD_STOP_GRACE_S": "20",
    "TORCHYARD_WORKER_STOP_GRACE_PERIOD": "40s",
    "TORCHYARD_MAX_NPROC_PER_NODE": "2",
    "TORCHYARD_WORKER_SHM_SIZE": "512mb",
}
# Rank 0 sleeps after every step (trainer/faults.py) so a test can act while a job is surely mid-way.
SLOW_STEPS = {"action": "slow", "step": 1, "seconds": 0.1, "rank": 0, "restart": None, "attempt": None}


def _no_engine_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH (../shared/docker-standins/setup.sh installs the engine and Compose)"
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the Docker engine does not answer (docker info timed out)"
    if info.returncode != 0:
        return f"no Docker engine answers: {(info.stderr or info.stdout).strip()[:200]}"
    compose = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=30)
    if compose.returncode != 0:
        return "the Docker Compose v2 plugin is missing (docker compose version failed)"
    return None


def _readme_gpu_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Run it on a GPU host")
    return text[start:text.index("\n## ", start + 1)]


def readme_secrets_command() -> str:
    """The README quick start's `sed` that fills the secrets of a fresh .env."""
    match = re.search(r"^sed -i .*\.env$", _readme_gpu_section(), re.MULTILINE)
    assert match, "no sed line filling .env in the README's GPU quick start"
    return match.group()


def readme_job() -> dict[str, Any]:
    """The job the README's GPU quick start POSTs, exactly as written."""
    match = re.search(r"-d '(\{.*?\})'", _readme_gpu_section(), re.S)
    assert match, "no curl -d '{...}' in the README's GPU quick start"
    return json.loads(match.group(1))


class Stack:
    """One compose project of docker-compose.yml plus the CPU override, driven with the docker CLI."""

    def __init__(self, work: Path):
        self.work = work
        self.project = f"torchyard-test-{secrets.token_hex(4)}"
        self.env_file = work / ".env"
        self.faults_file = work / "docker-compose.faults.yml"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._write_env()
        self.faults_file.write_text(
            "services:\n  worker-cpu:\n    environment:\n"
            f"      TORCHYARD_FAULTS: '{json.dumps([SLOW_STEPS])}'\n", encoding="utf-8")
        self.files = [COMPOSE_FILE, CPU_OVERRIDE]
        values = composefile.read_env_file(self.env_file)
        self.client = httpx.Client(base_url=self.url, timeout=30,
                                   headers={"Authorization": f"Bearer {values['TORCHYARD_ADMIN_TOKEN']}"})

    def _write_env(self) -> None:
        """.env made the way the README says (copy the example, run its sed), then the test's settings."""
        shutil.copy(ENV_EXAMPLE, self.env_file)
        subprocess.run(["bash", "-c", readme_secrets_command()], cwd=self.work, check=True, timeout=30)
        values = composefile.read_env_file(self.env_file)
        empty = [k for k in ("TORCHYARD_ADMIN_TOKEN", "POSTGRES_PASSWORD", "REDIS_PASSWORD") if not values.get(k)]
        assert not empty, f"the README's sed left {empty} empty"
        settings = {**TEST_SETTINGS, "TORCHYARD_API_PORT": str(self.port)}
        lines = [line for line in self.env_file.read_text(encoding="utf-8").splitlines()
                 if line.partition("=")[0] not in settings]
        lines += [f"{key}={value}" for key, value in settings.items()]
        self.env_file.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _env(self) -> dict[str, str]:
        # The shell environment wins over --env-file in compose: nothing of the test runner's may leak in.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHYARD_", "COMPOSE_")) and k not in ("POSTGRES_PASSWORD", "REDIS_PASSWORD")}
        env["DOCKER_BUILDKIT"] = "0"  # the classic builder: BuildKit would pull its frontend image
        return env

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file),
                   *[a for f in self.files for a in ("-f", str(f))], *args]
        result = subprocess.run(command, cwd=ROOT, env=self._env(), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command[2:])} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def timed(self, name: str, *args: str, timeout: float = 300) -> None:
        started = time.monotonic()
        self.compose(*args, timeout=timeout)
        log.info("%s: %.1fs", name, time.monotonic() - started)

    def up(self, *extra: str) -> None:
        self.timed("up to healthy", "up", "-d", "--wait", "--wait-timeout", "240", *extra)

    def slow_steps(self) -> None:
        """From now on the workers run every job with SLOW_STEPS; compose recreates them with the new environment."""
        self.files = [COMPOSE_FILE, CPU_OVERRIDE, self.faults_file]
        self.up()

    def logs(self, *services: str, tail: int = 200) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), *services, check=False, timeout=60).stdout

    # ---- the API, as a user reaches it

    def submit(self, spec: dict[str, Any]) -> str:
        created = self.client.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        return created.json()["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def poll_job(self, job_id: str) -> dict[str, Any] | None:
        """The job, or None while the API answers 503 because a dependency is restarting."""
        try:
            response = self.client.get(f"/v1/jobs/{job_id}")
        except httpx.TransportError:
            return None
        if response.status_code == 503:
            return None
        assert response.status_code == 200, response.text
        return response.json()

    def wait_finished(self, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            job = self.poll_job(job_id)
            return job if job and job["status"] in TERMINAL else None

        try:
            return wait_until(finished, timeout_s, interval_s=0.5, what=f"job {job_id} to finish")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.job(job_id)}\n{self.logs('worker-cpu')}") from exc

    def wait_step(self, job_id: str, step: int, timeout_s: float = 120) -> int:
        def reached() -> int | None:
            job = self.poll_job(job_id)
            if job is None:
                return None
            assert job["status"] not in TERMINAL, f"job {job_id} ended before step {step}: {job['status']} {job.get('error')}"
            return job["last_step"] if (job["last_step"] or 0) >= step else None

        return wait_until(reached, timeout_s, interval_s=0.3, what=f"job {job_id} to reach step {step}")

    def metric_steps(self, job_id: str, name: str = "train/loss") -> list[int]:
        response = self.client.get(f"/v1/jobs/{job_id}/metrics", params={"name": name, "limit": 10000})
        assert response.status_code == 200, response.text
        assert response.json()["next_cursor"] is None
        return [item["step"] for item in response.json()["items"]]

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        response = self.client.get(f"/v1/jobs/{job_id}/checkpoints")
        assert response.status_code == 200, response.text
        return response.json()["items"]

    def weights(self, job_id: str) -> dict[str, Any]:
        """The final weights, downloaded and opened as safetensors."""
        from safetensors.torch import load

        response = self.client.get(f"/v1/jobs/{job_id}/weights")
        assert response.status_code == 200, response.text
        return load(response.content)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reason = _no_engine_reason()
    if reason:
        pytest.skip(reason)
    stack = Stack(tmp_path_factory.mktemp("compose"))
    try:
        stack.timed("build", "build", timeout=1500)
        stack.up()
        yield stack
    except BaseException:
        log.error("compose logs:\n%s", stack.logs())
        raise
    finally:
        stack.client.close()
        stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False, timeout=300)
        left = subprocess.run(["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={stack.project}"],
                              capture_output=True, text=True, timeout=60).stdout.split()
        assert left == [], f"volumes left behind: {left}"


# The tests share one stack and the jobs of the tests before them.
finished_jobs: dict[str, dict[str, Any]] = {}
restarted_jobs: list[str] = []
two_node_jobs: list[str] = []


def _remember(stack: Stack, job_id: str) -> None:
    finished_jobs[job_id] = {"metrics": stack.metric_steps(job_id), "checkpoints": stack.checkpoints(job_id)}


def _slow_spec(name: str, steps: int, **parallel: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": "mlp", "args": {"hidden": 32}},
        "data": {"name": "synthetic-classification", "args": {"samples": 64 * steps, "features": 16, "classes": 4}},
        "parallel": {"strategy": "ddp", "nproc_per_node": 1, "device": "cpu", **parallel},
        "train": {"epochs": 1, "global_batch_size": 64, "log_every_steps": 1},
        "checkpoint": {"every_steps": 10},
    }


def test_readme_quick_start_job_trains_in_the_containers(stack: Stack) -> None:
    spec = readme_job()
    started = time.monotonic()
    job_id = stack.submit(spec)
    job = stack.wait_finished(job_id)
    log.info("README job, POST to succeeded: %.1fs", time.monotonic() - started)
    assert job["status"] == "succeeded", f"{job.get('error')}\n{stack.logs('worker-cpu')}"
    assert job["run_dir"].startswith(RUNS + "/")

    # 8192 samples / 64 per step x 2 epochs; checkpoints every 100 steps and at the end.
    assert job["last_step"] == 256
    checkpoints = stack.checkpoints(job_id)
    assert [c["step"] for c in checkpoints] == [100, 200, 256]
    assert all(c["available"] for c in checkpoints)
    assert checkpoints[-1]["weights_url"]
    weights = stack.weights(job_id)
    assert {t.shape[0] for name, t in weights.items() if name.endswith("weight")} >= {256}, list(weights)

    # The rank's log (written by the worker container) and torchrun's launcher log, read through the API container.
    rank0 = stack.client.get(f"/v1/jobs/{job_id}/logs", params={"rank": 0})
    assert rank0.status_code == 200 and "checkpoint step_00000256 saved" in rank0.text, rank0.text[-2000:]
    assert stack.client.get(f"/v1/jobs/{job_id}/logs", params={"tail": 20}).status_code == 200
    _remember(stack, job_id)


# A user's working directory: a script importing a sibling package and reporting through the SDK.
BUNDLE_SCRIPT = """import sys
from helpers import GREETING
from torchyard import report
print(GREETING, sys.argv[1:], flush=True)
for step in (1, 2, 3):
    report.metrics(step, {"train/loss": 1.0 / step})
"""


def test_code_bundle_uploads_and_its_script_runs_in_the_containers(stack: Stack, tmp_path: Path) -> None:
    """`submit(workdir=...)` through the client: the API (uid 10001 in its image) stores the bundle on the runs volume,
    the worker container unpacks its own copy and runs the script from it."""
    from torchyard.client import Client

    work = tmp_path / "project"
    (work / "helpers").mkdir(parents=True)
    (work / "helpers" / "__init__.py").write_text("GREETING = 'hello from the bundle'\n")
    (work / "train.py").write_text(BUNDLE_SCRIPT)
    key = stack.client.post("/v1/keys", json={"owner": "bundle-user", "name": "compose test"})
    assert key.status_code == 201, key.text
    started = time.monotonic()
    with Client(stack.url, key.json()["key"]) as client:
        job = client.submit({"kind": "script", "name": "from-bundle", "entrypoint": "train.py", "args": ["--x", "1"],
                             "parallel": {"nproc_per_node": 1}}, workdir=work)
        assert job.spec["code"].startswith("sha256:")
        # The tenant's job: the stack's admin client gets 404 for it, like any other owner.
        wait_until(lambda: client.job(job.id).terminal, 300, interval_s=0.5, what=f"job {job.id} to finish")
        finished = client.job(job.id)
        log.info("bundle job, upload to succeeded: %.1fs", time.monotonic() - started)
        assert finished.succeeded, f"{finished.error}\n{stack.logs('api', 'worker-cpu')}"
        assert finished.last_step == 3
        rank0 = client.logs(job.id, rank=0)
        assert "hello from the bundle ['--x', '1']" in rank0, rank0[-2000:]
        assert client.upload_code(work).uploaded is False  # stored once


def test_stopped_worker_checkpoints_requeues_and_resumes_after_start(stack: Stack) -> None:
    stack.slow_steps()
    job_id = stack.submit(_slow_spec("stop-start", steps=120))
    stack.wait_step(job_id, 15)

    stack.compose("stop", "worker-cpu", timeout=120)
    job = stack.job(job_id)
    assert job["status"] == "queued", (job["status"], job["transitions"][-3:], stack.logs("worker-cpu"))
    saved = max(c["step"] for c in stack.checkpoints(job_id))
    assert 15 <= saved < 120 and saved == job["last_step"], "the stop saved no checkpoint of the step it stopped at"

    stack.compose("start", "worker-cpu", timeout=120)
    job = stack.wait_finished(job_id)
    assert job["status"] == "succeeded", f"{job.get('error')}\n{stack.logs('worker-cpu')}"
    assert job["last_step"] == 120
    resumed = [a["resumed_from_step"] for a in job["attempts"]]
    assert resumed[-1] == saved, f"attempts resumed from {resumed}, the stop saved step {saved}"
    # No step trained twice: the second attempt started right after the preemption checkpoint.
    assert stack.metric_steps(job_id) == list(range(1, 121))
    _remember(stack, job_id)


def test_job_survives_postgres_and_redis_restarts(stack: Stack) -> None:
    job_id = stack.submit(_slow_spec("dependency-restarts", steps=150))
    step = stack.wait_step(job_id, 10)

    stack.compose("restart", "postgres", timeout=120)
    step = stack.wait_step(job_id, step + 10)  # ingestion came back: new steps reach SQL again
    stack.compose("restart", "redis", timeout=120)

    job = stack.wait_finished(job_id)
    assert job["status"] == "succeeded", f"{job.get('error')}\n{stack.logs('worker-cpu')}"
    assert job["last_step"] == 150
    assert [c["step"] for c in stack.checkpoints(job_id)] == list(range(10, 151, 10))
    restarted_jobs.append(job_id)
    _remember(stack, job_id)


def test_restarts_mid_job_cost_no_attempt_and_store_every_metric_step_once(stack: Stack) -> None:
    if not restarted_jobs:
        pytest.skip("the restart test finished no job")
    job = stack.job(restarted_jobs[0])
    assert [a["outcome"] for a in job["attempts"]] == ["succeeded"], job["transitions"]
    assert stack.metric_steps(restarted_jobs[0]) == list(range(1, 151)), "every metric step stored exactly once"


def test_two_node_job_across_two_worker_containers(stack: Stack) -> None:
    stack.up("--scale", "worker-cpu=2")
    job_id = stack.submit(_slow_spec("two-nodes", steps=30, nnodes=2))
    job = stack.wait_finished(job_id)
    assert job["status"] == "succeeded", f"{job.get('error')}\n{stack.logs('worker-cpu')}"
    assert job["last_step"] == 30
    # Node 0 (the gang's leader) in one worker container, node 1 in the other, over the compose network.
    lines = stack.logs("worker-cpu", tail=5000).splitlines()

    def replicas(*texts: str) -> set[str]:
        return {line.split("|", 1)[0].strip() for line in lines if all(t in line for t in texts) and "|" in line}

    leader, follower = replicas(f"job {job_id} attempt", "gang of 2 meets at"), replicas(f"job {job_id} node 1: torchrun joins")
    assert len(leader) == 1 and len(follower) == 1 and leader != follower, (leader, follower)
    two_node_jobs.append(job_id)
    _remember(stack, job_id)


def test_two_node_job_serves_the_second_nodes_rank_log(stack: Stack) -> None:
    if not two_node_jobs:
        pytest.skip("the 2-node test finished no job")
    rank1 = stack.client.get(f"/v1/jobs/{two_node_jobs[0]}/logs", params={"rank": 1})
    assert rank1.status_code == 200 and "rank 1/2" in rank1.text, rank1.text[-2000:]


def test_no_service_logs_a_secret(stack: Stack) -> None:
    """The passwords travel in URLs (TORCHYARD_DATABASE_URL, TORCHYARD_REDIS_URL); no log line may carry them."""
    values = composefile.read_env_file(stack.env_file)
    logs = stack.logs(tail=100_000)
    assert "worker-cpu" in logs and "api" in logs
    for name in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "TORCHYARD_ADMIN_TOKEN"):
        assert values[name] not in logs, f"{name} appears in the services' logs"


def test_down_then_up_keeps_jobs_metrics_and_checkpoints(stack: Stack) -> None:
    assert finished_jobs, "the tests above left no finished job to find again"
    stack.timed("down", "down", "--timeout", "30", timeout=180)
    stack.up()
    for job_id, before in finished_jobs.items():
        job = stack.job(job_id)
        assert job["status"] == "succeeded", job_id
        assert stack.metric_steps(job_id) == before["metrics"], job_id
        assert stack.checkpoints(job_id) == before["checkpoints"], job_id
        assert stack.weights(job_id), job_id
