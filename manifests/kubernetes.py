"""Kubernetes manifests for one JobSpec: a plain batch/v1 Job running torchrun, a JobSet, or a Kubeflow PyTorchJob.

Both mount the spec from a ConfigMap at /etc/torchyard/spec.json, the run directory from a
PersistentVolumeClaim (ReadWriteMany when nnodes > 1: every node writes checkpoints there), an
in-memory /dev/shm for NCCL and DataLoader workers, and run as the images' non-root user.
"""

from __future__ import annotations

from typing import Any

from jobspec.spec import JobSpec
from manifests.launch import LaunchOptions, attempt_deadline_s, spec_json, torchrun

SPEC_DIR = "/etc/torchyard"
SPEC_PATH = f"{SPEC_DIR}/spec.json"
RUNS_MOUNT = "/var/lib/torchyard/runs"
DATA_MOUNT = "/var/lib/torchyard/data"
UID = 10001  # the user of docker/*.Dockerfile


# An Indexed Job's completion index is its pod's node rank.
_NODE_RANK = {"name": "NODE_RANK",
              "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}


def _labels(opts: LaunchOptions) -> dict[str, str]:
    return {"app.kubernetes.io/name": "torchyard", "app.kubernetes.io/component": "trainer", "torchyard.io/job": opts.name}


def _meta(name: str, spec: JobSpec, opts: LaunchOptions) -> dict[str, Any]:
    return {"name": name, "labels": _labels(opts), "annotations": {"torchyard.io/spec-name": spec.name}}


def config_map(spec: JobSpec, opts: LaunchOptions) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{opts.name}-spec", spec, opts),
            "data": {"spec.json": spec_json(spec)}}


def _container(name: str, spec: JobSpec, opts: LaunchOptions, command: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
    run_dir = f"{RUNS_MOUNT}/{opts.run_id}"
    container: dict[str, Any] = {
        "name": name,
        "image": opts.image,
        "command": command,
        "env": [
            {"name": "TORCHYARD_DATA_DIR", "value": DATA_MOUNT},
            # torchrun copies the failing rank's traceback here, as under the torchyard worker.
            {"name": "TORCHELASTIC_ERROR_FILE", "value": f"{run_dir}/error.json"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *env,
        ],
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "runs", "mountPath": RUNS_MOUNT},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if opts.data_pvc:
        container["volumeMounts"].append({"name": "data", "mountPath": DATA_MOUNT, "readOnly": True})
    if opts.gpus_per_node:
        container["resources"] = {"limits": {"nvidia.com/gpu": opts.gpus_per_node}}
    return container


def _pod_spec(opts: LaunchOptions, container: dict[str, Any], restart: str) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": f"{opts.name}-spec"}},
        {"name": "runs", "persistentVolumeClaim": {"claimName": opts.runs_pvc}},
        # The container runtime's default /dev/shm (64 MiB) breaks NCCL and DataLoader workers.
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    if opts.data_pvc:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": opts.data_pvc, "readOnly": True}})
    return {
        "restartPolicy": restart,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID},
        "containers": [container],
        "volumes": volumes,
    }


def _indexed_trainer(spec: JobSpec, opts: LaunchOptions, node0: str) -> dict[str, Any]:
    """The trainer container of an Indexed Job's pods. Static rendezvous: node ranks are the completion
    indexes, and node 0 (at the stable DNS name ``node0``) serves the store itself, so nothing depends
    on a pod resolving its own DNS name while it starts."""
    run_dir = f"{RUNS_MOUNT}/{opts.run_id}"
    if spec.parallel.nnodes == 1:
        return _container("trainer", spec, opts, torchrun(spec, SPEC_PATH, run_dir, ["--standalone"]), [])
    rendezvous = ["--node-rank=$(NODE_RANK)", f"--master-addr={node0}", f"--master-port={opts.rdzv_port}"]
    container = _container("trainer", spec, opts, torchrun(spec, SPEC_PATH, run_dir, rendezvous), [_NODE_RANK])
    container["ports"] = [{"name": "rendezvous", "containerPort": opts.rdzv_port}]
    return container


def k8s_job(spec: JobSpec, opts: LaunchOptions) -> list[dict[str, Any]]:
    """ConfigMap + (nnodes > 1: headless Service) + an Indexed batch/v1 Job, one pod per node.

    Node 0 hosts the rendezvous; the others find it by its stable DNS name
    ``<job>-0.<job>`` (Indexed Job hostname + the headless Service as subdomain).
    """
    nnodes = spec.parallel.nnodes
    container = _indexed_trainer(spec, opts, node0=f"{opts.name}-0.{opts.name}")
    pod = _pod_spec(opts, container, restart="Never")
    docs: list[dict[str, Any]] = [config_map(spec, opts)]
    if nnodes > 1:
        pod["subdomain"] = opts.name
        docs.append({
            "apiVersion": "v1", "kind": "Service", "metadata": _meta(opts.name, spec, opts),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": _labels(opts),
                     "ports": [{"name": "rendezvous", "port": opts.rdzv_port}]},
        })
    docs.append({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(opts.name, spec, opts),
        "spec": {
            "completionMode": "Indexed",
            "completions": nnodes,
            "parallelism": nnodes,
            # A retried pod finds the run directory on the PVC and resumes from its latest checkpoint.
            "backoffLimit": spec.retries,
            "activeDeadlineSeconds": attempt_deadline_s(spec),
            "template": {"metadata": {"labels": _labels(opts)}, "spec": pod},
        },
    })
    return docs


def pytorchjob(spec: JobSpec, opts: LaunchOptions) -> list[dict[str, Any]]:
    """ConfigMap + a Kubeflow Training Operator ``kubeflow.org/v1`` PyTorchJob (Master + nnodes-1 Workers).

    The operator gives every pod PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT,
    which torchrun reads as its own flags, so one command serves every replica.
    """
    nnodes = spec.parallel.nnodes
    run_dir = f"{RUNS_MOUNT}/{opts.run_id}"
    rendezvous = ["--standalone"] if nnodes == 1 else []
    # The operator finds the training container by this name.
    container = _container("pytorch", spec, opts, torchrun(spec, SPEC_PATH, run_dir, rendezvous), [])

    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": _labels(opts)}, "spec": _pod_spec(opts, container, restart="OnFailure")}}

    replicas = {"Master": replica(1)}
    if nnodes > 1:
        replicas["Worker"] = replica(nnodes - 1)
    return [config_map(spec, opts), {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(opts.name, spec, opts),
        "spec": {
            "nprocPerNode": str(spec.parallel.nproc_per_node),
            "runPolicy": {"backoffLimit": spec.retries, "activeDeadlineSeconds": attempt_deadline_s(spec), "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }]


def jobset(spec: JobSpec, opts: LaunchOptions) -> list[dict[str, Any]]:
    """ConfigMap + a ``jobset.x-k8s.io/v1alpha2`` JobSet: one replicated Indexed Job of nnodes pods.

    The JobSet controller creates the headless Service itself (``network.enableDNSHostnames``): pod
    ``<name>-node-0-0.<name>`` is node 0 and serves the rendezvous. One JobSet runs one attempt:
    ``failurePolicy.maxRestarts: 0`` and ``backoffLimit: 0`` leave retries to whoever runs the
    attempts (a resubmission with the same run directory resumes from its latest checkpoint), and
    ``terminationGracePeriodSeconds`` is the time the ranks get to checkpoint when the JobSet is
    deleted or its pods are evicted or preempted (SIGTERM first, as under Slurm and torchyard).
    """
    nnodes = spec.parallel.nnodes
    container = _indexed_trainer(spec, opts, node0=f"{opts.name}-node-0-0.{opts.name}")
    pod = _pod_spec(opts, container, restart="Never")
    pod["terminationGracePeriodSeconds"] = opts.stop_grace_s
    return [config_map(spec, opts), {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _meta(opts.name, spec, opts),
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "network": {"enableDNSHostnames": True, "subdomain": opts.name},
            "replicatedJobs": [{
                "name": "node",
                "replicas": 1,
                "template": {
                    "metadata": {"labels": _labels(opts)},
                    "spec": {
                        "completionMode": "Indexed",
                        "completions": nnodes,
                        "parallelism": nnodes,
                        "backoffLimit": 0,
                        "activeDeadlineSeconds": spec.timeout_s + opts.stop_grace_s,
                        "template": {"metadata": {"labels": _labels(opts)}, "spec": pod},
                    },
                },
            }],
        },
    }]
