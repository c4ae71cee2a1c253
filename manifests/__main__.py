"""``python -m manifests {k8s-job,jobset,pytorchjob,slurm} SPEC.yaml --image IMG``: print a launch file for a JobSpec.

The spec is read and checked exactly as the trainer reads it (jobspec.spec.load_spec_file), so a
spec that cannot run is refused here, naming the field, not on the cluster.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from jobspec.spec import JobSpec, SpecError, load_spec_file
from manifests import kubernetes, slurm
from manifests.launch import DEFAULT_RDZV_PORT, LaunchError, LaunchOptions, check_name, default_gpus, kube_name

log = logging.getLogger("manifests")

KUBERNETES: dict[str, Callable[[JobSpec, LaunchOptions], list[dict[str, Any]]]] = {
    "k8s-job": kubernetes.k8s_job,
    "jobset": kubernetes.jobset,
    "pytorchjob": kubernetes.pytorchjob,
}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the spec in the ConfigMap) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m manifests", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=[*KUBERNETES, "slurm"],
                        help="k8s-job: batch/v1 Indexed Job running torchrun; jobset: a JobSet (jobset.x-k8s.io); "
                             "pytorchjob: Kubeflow PyTorchJob; slurm: sbatch script")
    parser.add_argument("spec", type=Path, help="job spec, .yaml or .json (the same file POST /v1/jobs takes)")
    parser.add_argument("--image", help="worker image (docker/worker.Dockerfile); required except for slurm --container none")
    parser.add_argument("--name", help="Kubernetes object / Slurm job name; default: the spec's name, made a DNS label")
    parser.add_argument("--run-id", help="run directory name under the runs root; default: --name. Same id, same run: it resumes")
    parser.add_argument("--gpus-per-node", type=int, help="default: nproc_per_node, or 0 when parallel.device is cpu")
    parser.add_argument("--rdzv-port", type=int, default=DEFAULT_RDZV_PORT, help="rendezvous port on node 0 (multi-node)")
    k8s = parser.add_argument_group("Kubernetes")
    k8s.add_argument("--runs-pvc", default="torchyard-runs", help="PersistentVolumeClaim for run directories (RWX for nnodes > 1)")
    k8s.add_argument("--data-pvc", help="PersistentVolumeClaim holding the data root, mounted read-only")
    k8s.add_argument("--namespace", help="metadata.namespace of every object")
    k8s.add_argument("--stop-grace-s", type=int, default=90, help="jobset: terminationGracePeriodSeconds, the ranks' time to checkpoint")
    sl = parser.add_argument_group("Slurm")
    sl.add_argument("--runs-dir", help="runs root on a filesystem all nodes share; default $TORCHYARD_RUNS_DIR or $SLURM_SUBMIT_DIR/runs")
    sl.add_argument("--data-dir", help="data root; default $TORCHYARD_DATA_DIR or $SLURM_SUBMIT_DIR/data")
    sl.add_argument("--cpus-per-rank", type=int, default=4,
                    help="CPUs per rank: the script asks for --cpus-per-task = nproc_per_node x this (one task per node)")
    sl.add_argument("--container", choices=slurm.CONTAINERS, default="pyxis",
                    help="pyxis: srun --container-image; apptainer: apptainer exec; none: torchrun from the nodes' own environment")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    return parser


def render(args: argparse.Namespace) -> str:
    """The launch file's text for parsed arguments; raises LaunchError, SpecError, ValidationError or OSError."""
    spec = load_spec_file(args.spec)
    if not isinstance(spec, JobSpec):
        # A script job's entrypoint lives under the service's code root; on a cluster it is the image's business.
        raise LaunchError("kind: script specs are not supported; run torchrun with your entrypoint in your own image")
    if spec.secrets:
        # A manifest is a file people commit and share: a secret's value never goes into one.
        raise LaunchError(f"secrets ({', '.join(sorted(spec.secrets))}) are not written into launch files; remove them "
                          "from the spec and give them to the ranks through the cluster's own secret store "
                          "(a Kubernetes Secret in env, Slurm's exported environment)")
    name = check_name(args.name) if args.name else kube_name(spec.name)
    opts = LaunchOptions(
        name=name, run_id=args.run_id or name, image=args.image, rdzv_port=args.rdzv_port,
        gpus_per_node=default_gpus(spec) if args.gpus_per_node is None else args.gpus_per_node,
        runs_pvc=args.runs_pvc, data_pvc=args.data_pvc, stop_grace_s=args.stop_grace_s, runs_dir=args.runs_dir, data_dir=args.data_dir,
        container=args.container, cpus_per_rank=args.cpus_per_rank,
    )
    if opts.cpus_per_rank < 1:
        raise LaunchError("--cpus-per-rank must be 1 or more")
    if opts.gpus_per_node < 0:
        raise LaunchError("--gpus-per-node must be 0 or more")
    if args.target == "slurm":
        return slurm.sbatch(spec, opts)
    if not opts.image:
        raise LaunchError(f"--image is required for {args.target}")
    docs = KUBERNETES[args.target](spec, opts)
    if args.namespace:
        for doc in docs:
            doc["metadata"] = {"name": doc["metadata"]["name"], "namespace": args.namespace, **doc["metadata"]}
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        text = render(args)
    except (LaunchError, SpecError, ValidationError, OSError) as exc:
        log.error("%s: %s", args.spec, exc)
        return 2
    if args.output:
        args.output.write_text(text, encoding="utf-8")
        log.info("wrote %s", args.output)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
