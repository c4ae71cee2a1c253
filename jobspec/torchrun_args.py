"""The torchrun command line every launcher shares: the worker's executors (worker/launch.py) and the launch
files for Kubernetes and Slurm (manifests/), so a job behaves the same wherever it runs.

``--redirects=3``, not ``--tee``: the service's logs (jobs/reads/artifacts.py) and each rank's interleaved output
(trainer/rank_output.py) read the per-rank files torchrun writes under ``--log-dir``."""

from __future__ import annotations

from jobspec.spec import JobSpec, ScriptJobSpec


def launcher_flags(spec: JobSpec | ScriptJobSpec, topology: list[str], log_dir: str) -> list[str]:
    """torchrun's flags for one node: ``topology`` says how the nodes meet (``--standalone`` on one)."""
    return [
        *topology,
        f"--nproc-per-node={spec.parallel.nproc_per_node}",
        f"--max-restarts={spec.max_restarts}",
        # torchrun checks its ranks every 0.1 s by default; an agent that waits through a long job spent 3% of a core
        # on that (0.8 CPU-s in 30 s, on every node), while half a second more before a rank's exit is noticed
        # costs a job nothing.
        "--monitor-interval=0.5",
        f"--log-dir={log_dir}",
        "--redirects=3",
    ]


LOCAL_RANK = "${local_rank}"


def verbatim(arg: str) -> str:
    """``arg`` escaped for torchrun, which passes every rank its arguments through ``string.Template`` with the
    rank's ``local_rank`` (torch.distributed.launch's ``--local_rank=${local_rank}``): each ``$`` doubled but those
    of ``${local_rank}``, so that a rank receives exactly ``arg`` with only that replaced by its local rank, where
    torchrun alone would also turn ``$$`` into ``$`` and ``$local_rank`` into the number (pure)."""
    return LOCAL_RANK.join(part.replace("$", "$$") for part in arg.split(LOCAL_RANK))


def trainer_program(spec_path: str, run_dir: str, forked_from: str | None = None) -> list[str]:
    """What torchrun runs for a catalog job: the trainer, told its spec.json and run directory. With ``forked_from``
    (the trainer's ``__main__.py``, an absolute path) torchrun forks each rank from its own process, which has
    imported torch already, instead of starting an interpreter that imports it again (trainer/__main__.py)."""
    args = ["--spec", spec_path, "--run-dir", run_dir]
    if forked_from is not None:
        return ["--run-path", "--start-method=fork", forked_from, *args]
    return ["-m", "trainer", *args]
