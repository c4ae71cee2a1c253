"""How a job becomes a torchrun command line and environment.

Catalog jobs run ``-m trainer --spec ... --run-dir ...``; script jobs run the user's
entrypoint (``FILE.py args...`` or ``-m MODULE args...``) under the same torchrun
options, so lifecycle, logs, restarts and stopping are identical for both kinds.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from jobs.settings import Settings
from trainer.spec import JobSpec, ScriptJobSpec, SpecError, SpecProblem, env_problem, resolve_entrypoint
from worker.processes import JOB_MARK, NODE_MARK

log = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
ERROR_FILE = "error.json"
# Read by trainer.report (the SDK): its presence means "running under torchyard", its value is where events go.
RUN_DIR_ENV = "TORCHYARD_RUN_DIR"
RESUME_FROM_ENV = "TORCHYARD_RESUME_FROM"  # read by trainer.report.resume_path() when the run has no checkpoint yet


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
                     node: NodeLaunch | None = None) -> list[str]:
    """One node's torchrun invocation. ``--standalone`` picks a free port and a fresh
    rendezvous id, so two jobs on one host never join each other's rendezvous. A node of a
    multi-node job (``node``) joins its gang's c10d rendezvous instead; node 0 hosts its store
    (``is_host`` says so explicitly: on one machine every node would otherwise think it is the host).

    Raises SpecError when a script's entrypoint no longer resolves under the code root:
    the root may have changed since the job was accepted, and nothing outside it may run."""
    p = spec.parallel
    if node is None:
        topology = ["--standalone", "--nnodes=1"]
    else:
        topology = [
            f"--nnodes={node.nnodes}", f"--node-rank={node.node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={node.endpoint}", f"--rdzv-id={node.rdzv_id}", f"--local-addr={node.local_addr}",
            # A node that never comes must fail the launch in seconds, not torchrun's default 15 minutes.
            f"--rdzv-conf=join_timeout={int(node.join_timeout_s)},is_host={'true' if node.node_rank == 0 else 'false'}",
        ]
    launcher = [
        sys.executable, "-m", "torch.distributed.run",
        *topology,
        f"--nproc-per-node={p.nproc_per_node}",
        f"--max-restarts={spec.max_restarts}",
        f"--log-dir={run_dir / 'logs' / f'attempt-{attempt}'}",
        "--redirects=3",
    ]
    if isinstance(spec, ScriptJobSpec):
        return launcher + script_program(spec, settings.code_dir)
    return launcher + [
        "-m", "trainer",
        "--spec", str(run_dir / SPEC_FILE),
        "--run-dir", str(run_dir),
    ]


def script_program(spec: ScriptJobSpec, code_dir: Path) -> list[str]:
    """What torchrun runs for a script job: the resolved file, or ``-m module``, then the args verbatim."""
    try:
        entry = resolve_entrypoint(spec.entrypoint, code_dir)
    except ValueError as exc:
        raise SpecError([SpecProblem(("entrypoint",), f"{spec.entrypoint!r}: {exc}")]) from exc
    if entry.module is not None:
        return ["-m", entry.module, *spec.args]
    assert entry.file is not None
    # The resolved path, not the submitted one: a symlink swapped after this check cannot redirect torchrun.
    return [str(entry.file), *spec.args]


def torchrun_env(job_id: str, attempt: int, run_dir: Path, settings: Settings,
                 spec: JobSpec | ScriptJobSpec | None = None, resume_from: str | None = None,
                 node: NodeLaunch | None = None) -> dict[str, str]:
    """The environment of torchrun and every rank. For script jobs: the worker's environment without
    torchyard's own settings (they carry service credentials), the job's allow-listed ``env``, the
    code root on PYTHONPATH so its modules import, and ``resume_from`` (a retried job's inherited
    checkpoint) for the SDK's resume_path(); the worker's own variables always win."""
    env = dict(os.environ)
    if isinstance(spec, ScriptJobSpec):
        env = {k: v for k, v in env.items() if not k.startswith("TORCHYARD_")}
        for name, value in spec.env.items():
            # Checked at submission; checked again because the policy may have tightened since.
            if env_problem(name) is None:
                env[name] = value
            else:
                log.warning("job %s: env %s refused at launch", job_id, name, extra={"job_id": job_id})
        code_dir = str(settings.code_dir.resolve())
        inherited = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = code_dir + (os.pathsep + inherited if inherited else "")
        env["TORCHYARD_CODE_DIR"] = code_dir
        if resume_from:
            env[RESUME_FROM_ENV] = resume_from
    env.update({
        JOB_MARK: job_id,
        "TORCHYARD_ATTEMPT": str(attempt),
        RUN_DIR_ENV: str(run_dir.resolve()),
        # torchrun copies the root-cause rank's @record traceback here.
        "TORCHELASTIC_ERROR_FILE": str(run_dir / (node.error_file if node else ERROR_FILE)),
        "TORCHYARD_DATA_DIR": str(settings.data_dir.resolve()),
        "PYTHONUNBUFFERED": "1",
    })
    if node is not None:
        env[NODE_MARK] = str(node.node_rank)
    return env
