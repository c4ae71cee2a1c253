"""docker-compose.yml and its CPU override: valid compose files that say what the deployment needs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import composefile
from tests.deploy.composefile import COMPOSE_FILE, CPU_OVERRIDE, ENV_EXAMPLE, ROOT, InterpolationError

SECRETS = ("TORCHYARD_ADMIN_TOKEN", "POSTGRES_PASSWORD", "REDIS_PASSWORD")
RUNS_MOUNT = "/var/lib/torchyard/runs"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return composefile.load(COMPOSE_FILE)


@pytest.fixture(scope="module")
def cpu_override() -> dict[str, Any]:
    return composefile.load(CPU_OVERRIDE)


def _test_env() -> dict[str, str]:
    env = composefile.read_env_file(ENV_EXAMPLE)
    env.update(TORCHYARD_ADMIN_TOKEN="t0ken", POSTGRES_PASSWORD="pw", REDIS_PASSWORD="rpw")
    return env


@pytest.mark.parametrize("path", [COMPOSE_FILE, CPU_OVERRIDE], ids=lambda p: p.name)
def test_compose_file_is_valid_against_the_compose_spec(path: Path) -> None:
    binary = shutil.which("check-jsonschema")
    if binary is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    result = subprocess.run([binary, "--builtin-schema", "vendor.compose-spec", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_redis_keeps_queued_work(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert redis["healthcheck"]["test"]
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_redis_requires_the_password_every_client_uses(compose: dict[str, Any], cpu_override: dict[str, Any]) -> None:
    env = _test_env()
    redis = composefile.interpolate_tree(compose["services"]["redis"], env)
    command = redis["command"]
    assert command[command.index("--requirepass") + 1] == "rpw"
    # The healthcheck authenticates (REDISCLI_AUTH) and accepts only PONG, not a NOAUTH error.
    assert composefile.environment(redis)["REDISCLI_AUTH"] == "rpw"
    assert "PONG" in " ".join(redis["healthcheck"]["test"])
    services = {**compose["services"], "worker-cpu": cpu_override["services"]["worker-cpu"]}
    for name in ("api", "worker", "worker-cpu"):
        url = composefile.environment(composefile.interpolate_tree(services[name], env))["TORCHYARD_REDIS_URL"]
        assert url == "redis://:rpw@redis:6379/0", name


def test_postgres_has_a_healthcheck_and_a_volume(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])


def test_secrets_are_required_not_defaulted() -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8") + CPU_OVERRIDE.read_text(encoding="utf-8")
    for name in SECRETS:
        uses = re.findall(r"\$\{" + name + r"([^}]*)\}", text)
        assert uses, f"{name} is not used"
        assert all(use.startswith(":?") for use in uses), f"{name} must be ${{{name}:?...}} everywhere, found {uses}"


def test_compose_refuses_to_start_with_the_example_env_unfilled(compose: dict[str, Any]) -> None:
    unfilled = composefile.read_env_file(ENV_EXAMPLE)
    assert all(unfilled[name] == "" for name in SECRETS), ".env.example must not ship secret values"
    with pytest.raises(InterpolationError, match="TORCHYARD_ADMIN_TOKEN|POSTGRES_PASSWORD"):
        composefile.interpolate_tree(compose["services"]["api"], unfilled)


def test_every_variable_is_documented_in_env_example() -> None:
    documented = set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(encoding="utf-8"), re.MULTILINE))
    used: set[str] = set()
    for path in (COMPOSE_FILE, CPU_OVERRIDE):
        used |= composefile.referenced_variables(path.read_text(encoding="utf-8"))
    assert used - documented == set(), "add these to .env.example"
    # COMPOSE_* are Compose's own settings, read by docker compose itself.
    assert {v for v in documented - used if not v.startswith("COMPOSE_")} == set(), "documented but unused"


def test_api_service(compose: dict[str, Any]) -> None:
    api = composefile.interpolate_tree(compose["services"]["api"], _test_env())
    assert api["build"]["dockerfile"] == "docker/api.Dockerfile"
    assert any(p.endswith(":8000:8000") for p in api["ports"])
    assert api["command"][-2:] == ["--port", "8000"]
    for dep in ("redis", "postgres"):
        assert api["depends_on"][dep]["condition"] == "service_healthy"
    env = composefile.environment(api)
    assert env["TORCHYARD_ADMIN_TOKEN"] == "t0ken"
    assert env["TORCHYARD_DATABASE_URL"] == "postgresql+psycopg://torchyard:pw@postgres:5432/torchyard"
    assert env["TORCHYARD_REDIS_URL"] == "redis://:rpw@redis:6379/0"
    assert any(v.endswith(":" + RUNS_MOUNT) for v in api["volumes"])


def test_gpu_worker_service(compose: dict[str, Any]) -> None:
    worker = composefile.interpolate_tree(compose["services"]["worker"], _test_env())
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert worker.get("ipc") == "host" or worker.get("shm_size"), "NCCL and DataLoader workers need a large /dev/shm"
    assert worker["init"] is True
    # --scale worker=N: nothing may pin a replica to one name or one host port.
    assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    env = composefile.environment(worker)
    assert "TORCHYARD_ADMIN_TOKEN" not in env, "workers need no admin key"
    assert env["TORCHYARD_RUNS_DIR"] == RUNS_MOUNT
    # The grace period must outlast the trainer's checkpoint window plus the worker's bookkeeping.
    assert composefile.duration_seconds(worker["stop_grace_period"]) >= float(env["TORCHYARD_STOP_GRACE_S"]) + 30


def test_api_and_workers_share_settings_and_volumes(compose: dict[str, Any]) -> None:
    env = _test_env()
    api = composefile.interpolate_tree(compose["services"]["api"], env)
    worker = composefile.interpolate_tree(compose["services"]["worker"], env)
    api_env, worker_env = composefile.environment(api), composefile.environment(worker)
    shared = {k for k in api_env if k != "TORCHYARD_ADMIN_TOKEN"}
    assert {k: api_env[k] for k in shared} == {k: worker_env[k] for k in shared}
    assert api["volumes"] == worker["volumes"]


def test_cpu_override_parks_the_gpu_worker_and_runs_the_same_worker_on_cpu(compose: dict[str, Any], cpu_override: dict[str, Any]) -> None:
    services = cpu_override["services"]
    assert services["worker"] == {"profiles": ["gpu"]}, "the override may only park the GPU worker"
    env = _test_env()
    gpu = composefile.interpolate_tree(compose["services"]["worker"], env)
    cpu = composefile.interpolate_tree(services["worker-cpu"], env)
    assert "deploy" not in cpu and "profiles" not in cpu
    assert cpu["build"]["args"]["TORCH_VARIANT"] == "cpu"
    assert cpu["build"]["dockerfile"] == gpu["build"]["dockerfile"]
    # Everything but the GPU: build args, image tag, reservation, NCCL's ulimits.
    different = {"build", "image", "deploy", "ulimits"}
    assert {k: v for k, v in cpu.items() if k not in different} == {k: v for k, v in gpu.items() if k not in different}


def test_quick_start_sed_fills_the_example_env() -> None:
    """The README quick start fills the secrets with a sed over the lines .env.example ships."""
    text = ENV_EXAMPLE.read_text(encoding="utf-8")
    for name in SECRETS:
        assert re.search(rf"^{name}=$", text, re.MULTILINE), f"the quick start's sed expects an empty {name}= line"


def test_dockerignore_keeps_secrets_out_of_the_build_context() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert ".env" in lines and ".git" in lines



def test_quick_start_job_is_a_valid_spec() -> None:
    """The job docs/deploy.md's quick start POSTs is accepted: the docs stay exact."""
    from jobspec.spec import parse_spec

    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    match = re.search(r"-d '(\{.*?\})'\n", text, re.S)
    assert match, "no curl -d '{...}' in docs/deploy.md"
    spec = parse_spec(json.loads(match.group(1)))
    assert spec.parallel.nproc_per_node == 1, "the quick start must run on a host with a single GPU"
