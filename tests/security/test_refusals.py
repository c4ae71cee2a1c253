"""A tenant key tries to run what its owner may not: installed launchers as entrypoints, environment that
makes torch, NCCL, UCX or Python write or load a file of its choosing, queues it may not use, oversized
specs. Every attempt answers 422 naming the field, and no job row, Redis entry or process comes of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.security.conftest import Live, assert_refused

pytestmark = pytest.mark.slow

CATALOG = {"name": "c", "model": {"name": "mlp", "args": {"hidden": 8}}, "data": {"name": "synthetic-classification"},
           "train": {"global_batch_size": 8}}


def script(**fields: Any) -> dict[str, Any]:
    return {"kind": "script", "name": "attack", "entrypoint": "sibling.py", "queue": "gpu", **fields}


def test_entrypoints_run_only_code_in_the_code_root_or_listed_modules(live: Live, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    code = live.settings.code_dir
    (code / "escape.py").symlink_to(outside / "evil.py")
    attacks = [
        # The report's attack: an installed CLI whose arguments run a shell command.
        {"entrypoint": "dotenv", "args": ["-f", "/etc/hostname", "run", "--", "sh", "-c", f"id > {marker}"]},
        {"entrypoint": "pygments"}, {"entrypoint": "rich.syntax", "args": ["/proc/1/environ"]}, {"entrypoint": "watchfiles"},
        {"entrypoint": "typer"}, {"entrypoint": "mako.cmd"}, {"entrypoint": "alembic"}, {"entrypoint": "pip"},
        {"entrypoint": "runpy"}, {"entrypoint": "os"}, {"entrypoint": "trainer"}, {"entrypoint": "worker"}, {"entrypoint": "api"},
        {"entrypoint": "torch.utils.bottleneck"}, {"entrypoint": "json"},  # json.tool is listed, json is not
        {"entrypoint": "../outside/evil.py"}, {"entrypoint": str(outside / "evil.py")}, {"entrypoint": "escape.py"},
        {"entrypoint": "missing.py"}, {"entrypoint": "sibling.py\x00.txt"},
    ]
    with live.tenant("mallory") as mallory:
        for attack in attacks:
            assert_refused(mallory, live, "mallory", script(**attack), "entrypoint")
        assert mallory.get("/v1/jobs").json()["items"] == []
        # What the operator listed, and the code root's own files, are accepted (queue gpu: no worker runs them).
        for entrypoint in ("json.tool", "sibling.py", "sibling"):
            resp = mallory.post("/v1/jobs", json=script(entrypoint=entrypoint))
            assert resp.status_code == 201, resp.text
    assert not marker.exists()


# The report's list, then the loader and interpreter hooks and torchrun's own variables.
PATH_SETTING_NAMES = ["NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "TORCH_LOGS_OUT", "TORCH_TRACE", "TMPDIR", "TORCH_COMPILE_DEBUG_DIR",
                      "PYTORCH_KERNEL_CACHE_PATH", "UCX_MODULE_DIR", "NCCL_NET_PLUGIN", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH",
                      "PYTHONSTARTUP", "PYTHONWARNINGS", "WANDB_DIR", "HF_HOME", "TRANSFORMERS_CACHE", "TORCHYARD_JOB_ID",
                      "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PATH", "MY_SETTING"]


def test_env_and_secret_names_outside_the_allow_list_are_refused_for_every_kind(live: Live) -> None:
    with live.tenant("trudy") as trudy:
        for name in PATH_SETTING_NAMES:
            for spec in (script(env={name: "/tmp/x"}), {**CATALOG, "queue": "gpu", "env": {name: "/tmp/x"}}):
                assert_refused(trudy, live, "trudy", spec, f"env.{name}")
            assert_refused(trudy, live, "trudy", script(secrets={name: "/tmp/x"}), f"secrets.{name}")
        # A credential in env (shown in every response) is pointed at secrets instead.
        body = assert_refused(trudy, live, "trudy", script(env={"WANDB_API_KEY": "k"}), "env.WANDB_API_KEY")
        assert "secrets" in body["detail"]
        # Allowed names pass for both kinds.
        env = {"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "OMP_NUM_THREADS": "2", "WANDB_MODE": "offline",
               "APP_FLAG": "1"}
        for spec in (script(env=env), {**CATALOG, "queue": "gpu", "env": env}):
            resp = trudy.post("/v1/jobs", json=spec)
            assert resp.status_code == 201, resp.text
            assert resp.json()["spec"]["env"] == env


def test_oversized_specs_are_refused_without_echoing_secrets(live: Live) -> None:
    value = "s3cr3t-" * 1300  # 9100 characters, over the per-secret bound
    with live.tenant("oscar") as oscar:
        assert_refused(oscar, live, "oscar", script(args=["x" * 4000] * 17), "args")
        assert_refused(oscar, live, "oscar", script(args=["x" * 5000]), "args.0")
        assert_refused(oscar, live, "oscar", script(labels={f"k{i}": "v" for i in range(33)}), "labels")
        assert_refused(oscar, live, "oscar", script(env={f"APP_{i}": "v" for i in range(65)}), "env")
        assert_refused(oscar, live, "oscar", script(env={f"APP_{i}": "v" * 4000 for i in range(9)}), "env")
        assert_refused(oscar, live, "oscar", {**CATALOG, "queue": "gpu", "model": {"name": "mlp", "args": {"x": "y" * 20_000}}},
                       "model.args")
        body = assert_refused(oscar, live, "oscar", script(secrets={"HF_TOKEN": value}), "secrets.HF_TOKEN")
        assert "s3cr3t" not in str(body)
        body = assert_refused(oscar, live, "oscar", script(secrets={"HF_TOKEN": 12345}), "secrets.HF_TOKEN")
        assert "12345" not in str(body)


def test_queues_must_exist_and_be_allowed_for_the_key(live: Live) -> None:
    with live.tenant("quinn", queues=["default"]) as narrow, live.tenant("quinn", queues=["gpu"]) as gpu_only:
        assert_refused(narrow, live, "quinn", script(queue="nowhere"), "queue")  # unknown: not parked forever
        body = assert_refused(narrow, live, "quinn", script(queue="gpu"), "queue")  # exists, not this key's
        assert "default" in body["detail"]
        accepted = gpu_only.post("/v1/jobs", json=script(queue="gpu"))
        assert accepted.status_code == 201, accepted.text
    with live.admin() as admin:
        resp = admin.post("/v1/keys", json={"owner": "quinn", "name": "typo", "queues": ["gpu", "gpux"]})
        assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "queues"
        listed = {k["id"]: k for k in admin.get("/v1/keys").json()["items"]}
        assert sorted(k["queues"] for k in listed.values() if k["owner"] == "quinn") == [["default"], ["gpu"]]


def test_another_tenants_jobs_answer_404(live: Live) -> None:
    with live.tenant("alice") as alice, live.tenant("bob") as bob:
        job = alice.post("/v1/jobs", json=script(secrets={"HF_TOKEN": "alice-token"})).json()
        for method, suffix in [("GET", ""), ("POST", "/cancel"), ("POST", "/retry"), ("GET", "/metrics"), ("GET", "/checkpoints"),
                               ("GET", "/logs"), ("GET", "/logs?follow=true"), ("GET", "/events"), ("GET", "/weights")]:
            resp = bob.request(method, f"/v1/jobs/{job['id']}{suffix}")
            assert resp.status_code == 404, (method, suffix, resp.text)
            assert resp.json()["detail"] == f"job {job['id']} not found"
        assert bob.get("/v1/jobs").json()["items"] == []
        assert alice.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"
