"""python -m manifests: Kubernetes and Slurm launch files from a JobSpec.

The fast tests read the generated files; the slow ones run what they would run, here, with
real torchrun and the real trainer on the CPU, the cluster's part played by the test: the
ConfigMap and volume become files and directories, the Training Operator's PET_* variables and
srun's one task per node are set up by hand (two "nodes" on this host for the multi-node cases).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobspec.spec import parse_spec
from manifests.__main__ import main
from manifests.launch import kube_name, slurm_time
from stack.redis_server import free_port
from tests.deploy.composefile import ROOT

SPEC: dict[str, Any] = {
    "name": "Tiny_MLP.v1",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 256, "features": 8, "classes": 2}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 2},
    "checkpoint": {"every_steps": 4},
    "retries": 1,
    "timeout_s": 600,
}


def _with(**parallel: Any) -> dict[str, Any]:
    return {**SPEC, "parallel": {**SPEC["parallel"], **parallel}}


def _write_spec(tmp_path: Path, spec: dict[str, Any], suffix: str = ".yaml") -> Path:
    path = tmp_path / f"spec{suffix}"
    path.write_text(yaml.safe_dump(spec) if suffix == ".yaml" else json.dumps(spec), encoding="utf-8")
    return path


def _generate(tmp_path: Path, target: str, spec: dict[str, Any], *extra: str) -> str:
    out = tmp_path / f"{target}.out"
    assert main([target, str(_write_spec(tmp_path, spec)), "-o", str(out), *extra]) == 0
    return out.read_text(encoding="utf-8")


def _docs(tmp_path: Path, target: str, spec: dict[str, Any], *extra: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(_generate(tmp_path, target, spec, "--image", "registry.example/torchyard-worker:0.1.0", *extra)))
    return {doc["kind"]: doc for doc in docs}


def _container(pod_template: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_template["spec"]["containers"]
    return container


# ------------------------------------------------------------------ Kubernetes


def test_k8s_job_single_node(tmp_path: Path) -> None:
    docs = _docs(tmp_path, "k8s-job", SPEC)
    assert set(docs) == {"ConfigMap", "Job"}
    config, job = docs["ConfigMap"], docs["Job"]
    assert job["metadata"]["name"] == "tiny-mlp-v1"
    assert job["metadata"]["annotations"]["torchyard.io/spec-name"] == "Tiny_MLP.v1"
    # The ConfigMap carries the spec the trainer will read, equal to the one given.
    assert parse_spec(json.loads(config["data"]["spec.json"])) == parse_spec(SPEC)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    assert job["spec"]["backoffLimit"] == 1
    assert job["spec"]["activeDeadlineSeconds"] == 1200
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "spec", "configMap": {"name": config["metadata"]["name"]}} in pod["volumes"]
    container = _container(job["spec"]["template"])
    assert container["image"] == "registry.example/torchyard-worker:0.1.0"
    assert container["command"][:2] == ["torchrun", "--standalone"]
    assert container["command"][-6:] == ["-m", "trainer", "--spec", "/etc/torchyard/spec.json",
                                         "--run-dir", "/var/lib/torchyard/runs/tiny-mlp-v1"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}


def test_k8s_job_multi_node_meets_at_node_zero(tmp_path: Path) -> None:
    docs = _docs(tmp_path, "k8s-job", _with(nnodes=4), "--name", "big", "--rdzv-port", "29400")
    assert set(docs) == {"ConfigMap", "Service", "Job"}
    service, job = docs["Service"], docs["Job"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]
    # The headless Service selects the pods and is their subdomain: big-0.big resolves to node 0.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"] == "big"
    command = _container(pod)["command"]
    assert "--standalone" not in command
    assert {"--node-rank=$(NODE_RANK)", "--master-addr=big-0.big", "--master-port=29400", "--nnodes=4"} <= set(command)
    env = {e["name"]: e for e in _container(pod)["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def test_pytorchjob(tmp_path: Path) -> None:
    docs = _docs(tmp_path, "pytorchjob", _with(nnodes=2), "--namespace", "ml", "--data-pvc", "datasets")
    job = docs["PyTorchJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert job["metadata"]["namespace"] == docs["ConfigMap"]["metadata"]["namespace"] == "ml"
    assert job["spec"]["nprocPerNode"] == "2"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 1
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1
    for replica in replicas.values():
        container = _container(replica["template"])
        assert container["name"] == "pytorch"  # the operator finds the container by this name
        # Node rank and master come from the operator's PET_* variables, not the command line.
        assert not any(a.startswith(("--standalone", "--master-addr", "--node-rank")) for a in container["command"])
        assert {"name": "data", "mountPath": "/var/lib/torchyard/data", "readOnly": True} in container["volumeMounts"]
    single = _docs(tmp_path, "pytorchjob", SPEC)["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
    assert set(single) == {"Master"}
    assert "--standalone" in _container(single["Master"]["template"])["command"]


def test_cpu_jobs_request_no_gpus(tmp_path: Path) -> None:
    cpu = _docs(tmp_path, "k8s-job", _with(device="cpu"))["Job"]
    assert "resources" not in _container(cpu["spec"]["template"])
    forced = _docs(tmp_path, "k8s-job", SPEC, "--gpus-per-node", "8")["Job"]
    assert _container(forced["spec"]["template"])["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize(("text", "name"), [("Tiny_MLP.v1", "tiny-mlp-v1"), ("--a..b--", "a-b"), ("x" * 80, "x" * 52)])
def test_kube_name(text: str, name: str) -> None:
    assert kube_name(text) == name


@pytest.mark.parametrize(("seconds", "time"), [(1, "0-00:01:00"), (3600, "0-01:00:00"), (86_400 * 2 + 61, "2-00:02:00")])
def test_slurm_time_rounds_up_to_minutes(seconds: int, time: str) -> None:
    assert slurm_time(seconds) == time


@pytest.mark.parametrize(("args", "message"), [
    (["k8s-job"], "--image is required"),
    (["k8s-job", "--image", "i", "--name", "Not_A_Label"], "--name"),
    (["slurm"], "--image is required with --container pyxis"),
])
def test_bad_options_exit_2(tmp_path: Path, caplog: pytest.LogCaptureFixture, args: list[str], message: str) -> None:
    spec = _write_spec(tmp_path, SPEC)
    assert main([args[0], str(spec), *args[1:]]) == 2
    assert message in caplog.text


def test_a_spec_that_cannot_run_is_refused_naming_the_field(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = _write_spec(tmp_path, {**SPEC, "train": {**SPEC["train"], "global_batch_size": 33}}, ".json")
    assert main(["k8s-job", str(spec), "--image", "i"]) == 2
    assert "train.global_batch_size" in caplog.text


@pytest.mark.parametrize("target", ["k8s-job", "slurm"])
def test_secrets_are_refused_and_never_written(tmp_path: Path, caplog: pytest.LogCaptureFixture, target: str) -> None:
    spec = _write_spec(tmp_path, {**SPEC, "secrets": {"WANDB_API_KEY": "hunter2-secret-value"}}, ".json")
    out = tmp_path / "launch.out"
    assert main([target, str(spec), "--image", "i", "-o", str(out)]) == 2
    assert "WANDB_API_KEY" in caplog.text and "secret store" in caplog.text
    assert not out.exists()
    assert "hunter2" not in caplog.text


def test_script_specs_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("", encoding="utf-8")
    spec = _write_spec(tmp_path, {"kind": "script", "name": "s", "entrypoint": "train.py"})
    assert main(["k8s-job", str(spec), "--image", "i"]) in (2,)
    assert "kind: script" in caplog.text or "entrypoint" in caplog.text


# ------------------------------------------------------------------ Slurm


def _heredoc_spec(script: str) -> dict[str, Any]:
    body = re.search(r"<<'TORCHYARD_SPEC_JSON'\n(.*?)\nTORCHYARD_SPEC_JSON\n", script, re.S)
    assert body, "no spec heredoc"
    return json.loads(body.group(1))


def test_slurm_script(tmp_path: Path) -> None:
    script = _generate(tmp_path, "slurm", _with(nnodes=2), "--image", "nvcr.io/acme/torchyard-worker:0.1.0")
    assert subprocess.run(["bash", "-n", str(tmp_path / "slurm.out")]).returncode == 0
    assert script.startswith("#!/bin/bash\n")
    directives = re.findall(r"^#SBATCH (\S+)$", script, re.M)
    # One task per node runs that node's torchrun: it needs CPUs for all of its ranks (2 x 4 by default).
    assert {"--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=2", "--cpus-per-task=8", "--time=0-00:10:00",
            "--job-name=tiny-mlp-v1"} <= set(directives)
    assert parse_spec(_heredoc_spec(script)) == parse_spec(_with(nnodes=2))
    assert "--container-image=nvcr.io/acme/torchyard-worker:0.1.0" in script
    assert "--rdzv-backend=c10d" in script and "--standalone" not in script


def test_slurm_apptainer_and_host_python(tmp_path: Path) -> None:
    apptainer = _generate(tmp_path, "slurm", _with(device="cpu"), "--container", "apptainer", "--image", "/images/worker.sif",
                          "--cpus-per-rank", "3")
    assert "#SBATCH --cpus-per-task=6\n" in apptainer
    assert "apptainer exec --bind=" in apptainer and "--nv" not in apptainer and "--gpus-per-node" not in apptainer
    host = _generate(tmp_path, "slurm", SPEC, "--container", "none", "--runs-dir", "/shared/torch yard/runs")
    assert "RUNS_DIR='/shared/torch yard/runs'" in host
    assert "srun --kill-on-bad-exit=1 \\\n    torchrun \\\n    --standalone" in host


# ------------------------------------------------------------------ run natively


def _shims(tmp_path: Path) -> Path:
    """torchrun from this interpreter; srun and scontrol played the way a Slurm allocation would."""
    shims = tmp_path / "shims"
    shims.mkdir()
    scripts = {
        "torchrun": f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n',
        # srun with --ntasks-per-node=1: its own options dropped, the command once per node, concurrently.
        "srun": (
            "#!/bin/bash\n"
            'while [[ "$1" == --* ]]; do shift; done\n'
            "pids=()\n"
            'for ((i = 0; i < ${SLURM_NNODES:-1}; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done\n'
            'rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc\n'
        ),
        "scontrol": "#!/bin/sh\necho 127.0.0.1\n",
    }
    for name, text in scripts.items():
        path = shims / name
        path.write_text(text, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return shims


def _env(shims: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHYARD_", "PET_", "SLURM_"))}
    env.update(PATH=f"{shims}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               TORCHYARD_LOG_LEVEL="WARNING", **extra)
    return env


def _assert_trained(run_dir: Path, outputs: str) -> None:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    assert any(e["type"] == "status" and e.get("phase") == "done" for e in events), outputs
    assert any(e["type"] == "checkpoint" for e in events), outputs
    assert not (run_dir / "error.json").exists(), (run_dir / "error.json").read_text(encoding="utf-8")


def _run_container(container: dict[str, Any], mounts: dict[str, Path], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a generated container's command with its env, container paths mapped to host directories."""

    def local(text: str) -> str:
        for target, source in mounts.items():
            text = text.replace(target, str(source))
        return text

    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = local(item["value"])
    command = [local(arg) for arg in container["command"]]
    return subprocess.Popen(command, env=env, cwd=mounts["/var/lib/torchyard/runs"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _volumes(tmp_path: Path, config_map: dict[str, Any]) -> dict[str, Path]:
    mounts = {"/etc/torchyard": tmp_path / "configmap", "/var/lib/torchyard/runs": tmp_path / "pvc-runs",
              "/var/lib/torchyard/data": tmp_path / "pvc-data"}
    for path in mounts.values():
        path.mkdir()
    for key, value in config_map["data"].items():
        (mounts["/etc/torchyard"] / key).write_text(value, encoding="utf-8")
    return mounts


@pytest.mark.slow
def test_k8s_job_container_trains(tmp_path: Path) -> None:
    docs = _docs(tmp_path, "k8s-job", _with(device="cpu"))
    mounts = _volumes(tmp_path, docs["ConfigMap"])
    proc = _run_container(_container(docs["Job"]["spec"]["template"]), mounts, _env(_shims(tmp_path)))
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-6000:]
    _assert_trained(mounts["/var/lib/torchyard/runs"] / "tiny-mlp-v1", out[-6000:])


@pytest.mark.slow
def test_pytorchjob_two_nodes_train(tmp_path: Path) -> None:
    """The Master and the Worker replica, as the Training Operator starts them, on this host."""
    spec = {**_with(device="cpu", nnodes=2, nproc_per_node=1)}
    docs = _docs(tmp_path, "pytorchjob", spec)
    mounts = _volumes(tmp_path, docs["ConfigMap"])
    replicas = docs["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
    port, shims = free_port(), _shims(tmp_path)
    procs = []
    for node_rank, role in enumerate(["Master", "Worker"]):
        operator_env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": docs["PyTorchJob"]["spec"]["nprocPerNode"],
                        "PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(node_rank)}
        procs.append(_run_container(_container(replicas[role]["template"]), mounts, _env(shims, **operator_env)))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outs)
    _assert_trained(mounts["/var/lib/torchyard/runs"] / "tiny-mlp-v1", outs[0][-4000:])


@pytest.mark.slow
@pytest.mark.parametrize("nnodes", [1, 2])
def test_slurm_script_trains(tmp_path: Path, nnodes: int) -> None:
    """sbatch's part: run the script in an allocation's environment; srun starts one torchrun per node."""
    spec = _with(device="cpu", nnodes=nnodes, nproc_per_node=2 // nnodes)
    _generate(tmp_path, "slurm", spec, "--container", "none")
    submit = tmp_path / "submit"
    submit.mkdir()
    env = _env(_shims(tmp_path), SLURM_SUBMIT_DIR=str(submit), SLURM_JOB_ID=str(free_port()), SLURM_NNODES=str(nnodes),
               SLURM_JOB_NODELIST="node[1-2]")
    proc = subprocess.run(["bash", str(tmp_path / "slurm.out")], env=env, cwd=submit, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    _assert_trained(submit / "runs" / "tiny-mlp-v1", (proc.stdout + proc.stderr)[-6000:])
