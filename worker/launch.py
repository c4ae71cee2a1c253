"""How a job becomes a torchrun command line and environment.

Catalog jobs run ``-m trainer --spec ... --run-dir ...``; script jobs run the user's
entrypoint through ``-m trainer.rank_bootstrap CODE_ROOT file|module TARGET args...`` (parent-death
signal, code root on sys.path, the run directory off it) under the same torchrun options, so
lifecycle, logs, restarts and stopping are identical for both kinds. A script job's code root is
its working directory (``runs/<id>/workdir``, a writable copy of its bundle or of its entry of
TORCHYARD_CODE_DIR: worker/workdir.py), where its ranks also start (``working_dir``); a job with
``requirements`` runs torchrun and its ranks with the Python of its environment (worker/venvs.py).

The ranks' environment is the worker's without torchyard's own settings (they carry service
credentials: database URL, admin token, secrets key) nor, with an object store, the AWS_* variables, plus the
job's allow-listed ``env``, its decrypted ``secrets`` and what torchyard tells every rank (job id, attempt, run directory).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session

from jobs.infra import secrets as job_secrets
from jobs.settings import Settings
from jobspec.env_rules import env_name_problem, name_problem
from jobspec.exit_codes import PAUSE_AT_ENV
from jobspec.spec import JobSpec, ScriptJobSpec, SpecError, SpecProblem, resolve_entrypoint
from jobspec.torchrun_args import launcher_flags, trainer_program, verbatim
from torchyard.sinks.factory import MLFLOW_URI_ENV
from worker import venvs, workdir
from worker.sandbox.processes import JOB_MARK, NODE_MARK
from worker.wandb_env import wandb_defaults

log = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
ERROR_FILE = "error.json"
# Read by torchyard.report (the SDK): its presence means "running under torchyard", its value is where events go.
RUN_DIR_ENV = "TORCHYARD_RUN_DIR"
RESUME_FROM_ENV = "TORCHYARD_RESUME_FROM"  # read by torchyard.report.resume_path() when the run has no checkpoint yet
# TORCHYARD_* variables of the worker that reach the ranks: they configure the trainer, never the service.
RANK_PASSTHROUGH = frozenset({"TORCHYARD_LOG_LEVEL", "TORCHYARD_FAULTS"})
SERVICE_PREFIXES: tuple[str, ...] = ("TORCHYARD_",)
# With TORCHYARD_STORAGE_URL the worker's AWS_* variables are the object store's credentials (and where boto3 finds
# others: AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE ...): never the ranks'. A job that needs its own passes them as secrets.
STORE_CREDENTIAL_PREFIXES: tuple[str, ...] = ("AWS_",)
BOOTSTRAP = "trainer.rank_bootstrap"  # every script rank starts here (trainer/rank_bootstrap.py)


@dataclass(frozen=True)
class NodeLaunch:
    """One node of a multi-node job: where the c10d rendezvous is and who hosts it."""

    nnodes: int
    node_rank: int
    endpoint: str  # host:port on node 0; the port was free there when its leader picked it
    rdzv_id: str  # <job>-a<attempt>: a new attempt never joins the rendezvous of an old one
    local_addr: str  # the address this node's agent advertises (MASTER_ADDR when it hosts global rank 0)
    join_timeout_s: float

    @property
    def error_file(self) -> str:
        # One per node: on shared storage the nodes' torchruns would overwrite each other's root cause.
        return ERROR_FILE if self.node_rank == 0 else f"error-node-{self.node_rank}.json"


def torchrun_command(spec: JobSpec | ScriptJobSpec, run_dir: Path, attempt: int, settings: Settings,
                     node: NodeLaunch | None = None, topology: list[str] | None = None) -> list[str]:
    """One node's torchrun invocation. ``--standalone`` picks a free port and a fresh
    rendezvous id, so two jobs on one host never join each other's rendezvous. A node of a
    multi-node job (``node``) joins its gang's c10d rendezvous instead; node 0 hosts its store
    (``is_host`` says so explicitly: on one machine every node would otherwise think it is the host).
    ``topology`` replaces those flags where an engine places the nodes (the Slurm executor's c10d flags).

    Raises SpecError when a script's entrypoint no longer resolves under the code root:
    the root may have changed since the job was accepted, and nothing outside it may run."""
    if topology is None and node is None:
        topology = ["--standalone", "--nnodes=1"]
    elif topology is None and node is not None:
        topology = [
            f"--nnodes={node.nnodes}", f"--node-rank={node.node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={node.endpoint}", f"--rdzv-id={node.rdzv_id}", f"--local-addr={node.local_addr}",
            # A node that never comes must fail the launch in seconds, not torchrun's default 15 minutes.
            f"--rdzv-conf=join_timeout={int(node.join_timeout_s)},is_host={'true' if node.node_rank == 0 else 'false'}",
        ]
    launcher = [venvs.interpreter(settings, _requirements(spec)), "-m", "torch.distributed.run",
                *launcher_flags(spec, topology, str(run_dir / "logs" / f"attempt-{attempt}"))]
    if isinstance(spec, ScriptJobSpec):
        # The entrypoint resolves in the job's working copy (worker/workdir.py), named relative to the code root.
        in_copy = spec.model_copy(update={"entrypoint": workdir.entrypoint_in(settings, spec)})
        return launcher + script_program(in_copy, workdir.code_root(settings, spec, run_dir), frozenset(settings.script_modules))
    return launcher + trainer_program(str(run_dir / SPEC_FILE), str(run_dir),
                                      forked_from=trainer_main() if settings.fork_ranks else None)


def trainer_main() -> str:
    """The trainer's ``__main__.py`` in this worker's installation, which catalog jobs' torchrun runs with the
    worker's own interpreter: found without importing the trainer (the worker does not import torch)."""
    found = importlib.util.find_spec("trainer")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("the trainer package is not installed beside the worker")
    return str(Path(next(iter(found.submodule_search_locations)), "__main__.py").resolve())


def start_dir(spec: JobSpec | ScriptJobSpec, run_dir: Path, settings: Settings) -> Path:
    """The working directory of torchrun and the ranks: a script's copy of its code, a catalog job's run directory."""
    return workdir.working_dir(settings, spec, run_dir) if isinstance(spec, ScriptJobSpec) else run_dir


def _requirements(spec: JobSpec | ScriptJobSpec) -> list[str]:
    return spec.requirements if isinstance(spec, ScriptJobSpec) else []


def script_program(spec: ScriptJobSpec, code_root: Path, allowed_modules: frozenset[str] = frozenset()) -> list[str]:
    """What torchrun runs for a script job: the rank bootstrap, told the code root and the resolved file or
    module, then the args, which reach the script verbatim but for ``${local_rank}``, each rank's own local rank
    (jobspec.torchrun_args.verbatim). ``code_root`` is the service's code root, or the job's unpacked bundle
    (``workdir.code_root``). A module under the code root goes with the file it resolved to: the bootstrap
    runs it only if the module still resolves there, never an installed module of the same name."""
    try:
        entry = resolve_entrypoint(spec.entrypoint, code_root, allowed_modules)
    except ValueError as exc:
        raise SpecError([SpecProblem(("entrypoint",), f"{spec.entrypoint!r}: {exc}")]) from exc
    root = str(code_root.resolve())
    args = [verbatim(arg) for arg in spec.args]
    if entry.module is not None and entry.file is not None:
        return ["-m", BOOTSTRAP, verbatim(root), "module", entry.module, verbatim(str(entry.file)), *args]
    if entry.module is not None:  # an installed module the operator allow-listed
        return ["-m", BOOTSTRAP, verbatim(root), "installed", entry.module, *args]
    assert entry.file is not None
    # The resolved path, not the submitted one: a symlink swapped after this check cannot redirect the rank.
    return ["-m", BOOTSTRAP, verbatim(root), "file", verbatim(str(entry.file)), *args]


def rank_secrets(session: Session, job_id: str, settings: Settings) -> dict[str, str]:
    """The job's secrets in clear, for torchrun_env only; SpecError when this worker cannot decrypt them
    (no TORCHYARD_SECRETS_KEY here, or another one than the API's): retrying on this worker cannot help."""
    try:
        return job_secrets.load(session, job_id, settings)
    except job_secrets.SecretsUnavailable as exc:
        raise SpecError([SpecProblem(("secrets",), f"this worker cannot decrypt the job's secrets: {exc}")]) from None


def torchrun_env(job_id: str, attempt: int, run_dir: Path, settings: Settings,
                 spec: JobSpec | ScriptJobSpec | None = None, resume_from: str | None = None,
                 node: NodeLaunch | None = None, secrets: dict[str, str] | None = None,
                 gpus: tuple[int, ...] | None = None, pause_at: str | None = None) -> dict[str, str]:
    """The environment of torchrun and every rank: the worker's without torchyard's service settings (nor the
    AWS_* variables under an object store), the job's allow-listed ``env`` and its decrypted ``secrets`` (both
    checked again here: the policy may have tightened since the job was accepted), ``PYTHONSAFEPATH=1`` (a
    script's working directory goes on sys.path as its code root, through the bootstrap; the run directory never
    does), and for script jobs the code root, wandb's offline mode unless the job brought a key
    (worker/wandb_env.py) and ``resume_from`` (a retried job's inherited checkpoint) for the SDK's resume_path().
    The worker's own variables always win."""
    hidden = SERVICE_PREFIXES + (STORE_CREDENTIAL_PREFIXES if settings.storage_url else ())
    env = {k: v for k, v in os.environ.items() if not k.startswith(hidden) or k in RANK_PASSTHROUGH}
    if spec is not None:
        for section, values, rule in (("env", spec.env, env_name_problem), ("secrets", secrets or {}, name_problem)):
            for name, value in values.items():
                if rule(name) is None and "\x00" not in value:
                    env[name] = value
                else:
                    log.warning("job %s: %s %s refused at launch", job_id, section, name, extra={"job_id": job_id})
    if isinstance(spec, ScriptJobSpec):
        # The bootstrap puts the code root on sys.path (its argument); this tells the script where it is.
        env["TORCHYARD_CODE_DIR"] = str(workdir.code_root(settings, spec, run_dir).resolve())
        # After the tenant's env, so its requirements environment cannot be pointed elsewhere.
        env.update(venvs.env_vars(settings, spec.requirements, os.environ.get("PATH", os.defpath)))
        if resume_from:
            env[RESUME_FROM_ENV] = resume_from
        env.update(wandb_defaults(env))
    env.update({
        JOB_MARK: job_id,
        "TORCHYARD_ATTEMPT": str(attempt),
        RUN_DIR_ENV: str(run_dir.resolve()),
        # torchrun copies the root-cause rank's @record traceback here.
        "TORCHELASTIC_ERROR_FILE": str(run_dir / (node.error_file if node else ERROR_FILE)),
        "TORCHYARD_DATA_DIR": str(settings.data_dir.resolve()),
        "PYTHONUNBUFFERED": "1",
        "PYTHONSAFEPATH": "1",
    })
    if settings.mlflow_tracking_uri:
        # An operator setting, so a job cannot point its metrics (or the worker's network reach) elsewhere.
        env[MLFLOW_URI_ENV] = settings.mlflow_tracking_uri
    if node is not None:
        env[NODE_MARK] = str(node.node_rank)
    if pause_at is not None:
        env[PAUSE_AT_ENV] = pause_at
    if gpus is not None:
        # The placement's physical GPUs and no others: local rank i sees its job's i-th GPU as cuda:i.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
    return env
