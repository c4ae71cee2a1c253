"""What every launch file shares: names, paths and the torchrun command line for one JobSpec.

The command is the one the worker runs (worker/launch.py), so a job behaves the same under
torchyard, Kubernetes and Slurm: ``torchrun ... -m trainer --spec SPEC --run-dir RUN_DIR``, the
root-cause traceback in ``RUN_DIR/error.json``, per-rank logs under ``RUN_DIR/logs``, and a
rerun with the same run directory resumes from its latest checkpoint.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from jobspec.spec import JobSpec
from jobspec.torchrun_args import launcher_flags, trainer_program

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# An Indexed Job's pod hostname is "<job>-<index>" and must stay a DNS label (63); the spec
# ConfigMap adds "-spec". 52 leaves room for both.
MAX_NAME = 52
DEFAULT_RDZV_PORT = 29500


class LaunchError(ValueError):
    """Options that cannot produce a working launch file."""


@dataclass(frozen=True)
class LaunchOptions:
    name: str  # Kubernetes object / Slurm job name
    run_id: str  # directory under the runs root; a rerun with the same one resumes
    gpus_per_node: int
    image: str | None = None
    rdzv_port: int = DEFAULT_RDZV_PORT
    # Kubernetes: claims mounted at the images' paths. No data claim: synthetic data only.
    runs_pvc: str = "torchyard-runs"
    data_pvc: str | None = None
    stop_grace_s: int = 90  # Kubernetes: SIGTERM to SIGKILL when a pod is deleted, evicted or preempted
    # Slurm: paths on a filesystem every node shares; None: under the submit directory.
    runs_dir: str | None = None
    data_dir: str | None = None
    container: str = "pyxis"  # Slurm: pyxis | apptainer | none
    # Slurm: CPUs per rank. Without --cpus-per-task a task gets one CPU, and every rank and its data
    # workers would share it (the service's Slurm executor uses TORCHYARD_SLURM_CPUS_PER_RANK likewise).
    cpus_per_rank: int = 4


def kube_name(text: str) -> str:
    """A DNS-1123 label from a spec name ("MLP_v2.1" -> "mlp-v2-1")."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:MAX_NAME].rstrip("-")
    if not name:
        raise LaunchError(f"cannot make a Kubernetes name from {text!r}; pass --name")
    return name


def check_name(name: str) -> str:
    if len(name) > MAX_NAME or not DNS_LABEL.match(name):
        raise LaunchError(f"--name {name!r}: lowercase letters, digits and '-', at most {MAX_NAME} characters")
    return name


def default_gpus(spec: JobSpec) -> int:
    """One GPU per rank unless the spec asks for the CPU."""
    if spec.parallel.device == "cpu":
        return 0
    if spec.parallel.nproc_per_node == "gpu":
        # torchrun counts the node's GPUs itself; the scheduler must still be told how many to give.
        raise LaunchError("parallel.nproc_per_node is 'gpu': pass --gpus-per-node")
    return spec.parallel.nproc_per_node


def spec_json(spec: JobSpec) -> str:
    """The spec as the trainer reads it: every field explicit, so defaults cannot drift between versions."""
    return json.dumps(spec.visible_dump(), indent=2, sort_keys=False) + "\n"


def attempt_deadline_s(spec: JobSpec) -> int:
    """Wall-clock bound of the whole job: timeout_s for each allowed attempt."""
    return spec.timeout_s * (spec.retries + 1)


def slurm_time(seconds: int) -> str:
    """Slurm's D-HH:MM:SS, rounded up to the minute."""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def torchrun(spec: JobSpec, spec_path: str, run_dir: str, rendezvous: list[str]) -> list[str]:
    """torchrun for one node. ``rendezvous`` is ``["--standalone"]`` on one node, or how the nodes meet."""
    return ["torchrun", *launcher_flags(spec, [*rendezvous, f"--nnodes={spec.parallel.nnodes}"], f"{run_dir}/logs"),
            *trainer_program(spec_path, run_dir)]
