"""Every Kubernetes object `python -m manifests` generates is valid against Kubernetes' OpenAPI schemas
(strict: an unknown or misspelt field fails), as the Kubernetes executor will create them.

Built-in kinds (ConfigMap, Service, batch/v1 Job) are checked whole with kubernetes-validate, which
ships the JSON schemas generated from Kubernetes' OpenAPI document for each release. The custom
resources (JobSet, Kubeflow PyTorchJob) embed built-in types: their Job and Pod templates are checked
against those same schemas, and their own fields against the few each API defines (JobSet
v1alpha2, kubeflow.org/v1), written out below. No cluster was available to apply them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

from tests.deploy.test_manifests import SPEC, _docs, _with

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[test]')")
from kubernetes_validate import utils as kv  # noqa: E402

# The oldest release the JobSet controller supports and the newest kubernetes-validate knows.
VERSIONS = ["1.29", kv.major_minor(kv.latest_version())]
CASES = {
    "k8s-job 1 node": ("k8s-job", SPEC, []),
    "k8s-job 4 nodes": ("k8s-job", _with(nnodes=4), ["--data-pvc", "datasets"]),
    "jobset 1 node": ("jobset", SPEC, []),
    "jobset 2 nodes": ("jobset", _with(nnodes=2), ["--data-pvc", "datasets", "--stop-grace-s", "120"]),
    "pytorchjob 2 nodes": ("pytorchjob", _with(nnodes=2), []),
    "cpu jobset": ("jobset", _with(device="cpu"), []),
}

_STRICT: dict[str, Any] = {"type": "object", "additionalProperties": False}
# The fields of the custom resources' own specs (JobSet v1alpha2 JobSetSpec, kubeflow.org/v1 PyTorchJobSpec).
CRD_SPECS: dict[str, dict[str, Any]] = {
    "JobSet": {**_STRICT, "required": ["replicatedJobs"], "properties": {
        "replicatedJobs": {"type": "array", "minItems": 1, "items": {**_STRICT, "required": ["name", "template"], "properties": {
            "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}, "replicas": {"type": "integer", "minimum": 1},
            "template": {"type": "object"}, "dependsOn": {"type": "array"}, "groupName": {"type": "string"}}}},
        "network": {**_STRICT, "properties": {"enableDNSHostnames": {"type": "boolean"}, "subdomain": {"type": "string"},
                                              "publishNotReadyAddresses": {"type": "boolean"}}},
        "failurePolicy": {**_STRICT, "properties": {"maxRestarts": {"type": "integer", "minimum": 0}, "restartStrategy": {"type": "string"},
                                                    "rules": {"type": "array"}}},
        "successPolicy": {"type": "object"}, "startupPolicy": {"type": "object"}, "suspend": {"type": "boolean"},
        "coordinator": {"type": "object"}, "managedBy": {"type": "string"}, "ttlSecondsAfterFinished": {"type": "integer"}}},
    "PyTorchJob": {**_STRICT, "required": ["pytorchReplicaSpecs"], "properties": {
        "runPolicy": {**_STRICT, "properties": {
            "cleanPodPolicy": {"enum": ["All", "Running", "None"]}, "ttlSecondsAfterFinished": {"type": "integer"},
            "activeDeadlineSeconds": {"type": "integer"}, "backoffLimit": {"type": "integer"}, "schedulingPolicy": {"type": "object"},
            "suspend": {"type": "boolean"}, "managedBy": {"type": "string"}}},
        "pytorchReplicaSpecs": {"type": "object", "propertyNames": {"enum": ["Master", "Worker"]}, "additionalProperties": {
            **_STRICT, "required": ["template"], "properties": {
                "replicas": {"type": "integer", "minimum": 0}, "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
                "template": {"type": "object"}}}},
        "elasticPolicy": {"type": "object"}, "nprocPerNode": {"type": "string"}}},
}
# Where each custom resource embeds a built-in type, and which.
EMBEDDED = {
    "JobSet": lambda spec: [("jobtemplatespec-batch-v1", r["template"]) for r in spec["replicatedJobs"]],
    "PyTorchJob": lambda spec: [("podtemplatespec-v1", r["template"]) for r in spec["pytorchReplicaSpecs"].values()],
}


def _built_in_type(type_file: str, value: dict[str, Any], version: str) -> None:
    """``value`` against one type of Kubernetes' strict schemas (as kubernetes_validate.validate does for kinds)."""
    folder = f"kubernetes-json-schema/v{version}.0-local-strict"
    schema = kv.schema_contents(f"{folder}/{type_file}.json", version)
    registry = Resource.from_contents(kv.schema_contents(f"{folder}/_definitions.json", version)) @ Registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(value)


def _check(doc: dict[str, Any], version: str) -> None:
    kind = doc["kind"]
    if kind in CRD_SPECS:
        _built_in_type("objectmeta-meta-v1", doc["metadata"], version)
        jsonschema.Draft202012Validator(CRD_SPECS[kind]).validate(doc["spec"])
        for type_file, template in EMBEDDED[kind](doc["spec"]):
            _built_in_type(type_file, template, version)
    else:
        kv.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_generated_objects_are_valid_kubernetes(tmp_path: Path, case: str, version: str) -> None:
    target, spec, extra = CASES[case]
    docs = _docs(tmp_path, target, spec, *extra)
    for doc in docs.values():
        _check(doc, version)


@pytest.mark.parametrize(("kind", "mutate"), [
    ("Job", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(volumeMounts=[{"name": "runs"}])),  # no mountPath
    ("Job", lambda d: d["spec"].update(completionsMode="Indexed")),  # misspelt
    ("JobSet", lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].update(restartPolicy=3)),
    ("JobSet", lambda d: d["spec"]["failurePolicy"].update(maxRestart=1)),  # misspelt
    ("PyTorchJob", lambda d: d["spec"]["pytorchReplicaSpecs"].update(Chief={"template": {}})),
])
def test_the_check_catches_what_a_cluster_would_refuse(tmp_path: Path, kind: str, mutate: Any) -> None:
    target = {"Job": "k8s-job", "JobSet": "jobset", "PyTorchJob": "pytorchjob"}[kind]
    doc = _docs(tmp_path, target, SPEC)[kind]
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        _check(doc, VERSIONS[-1])


def test_a_jobset_runs_one_attempt_and_meets_at_node_zero(tmp_path: Path) -> None:
    docs = _docs(tmp_path, "jobset", _with(nnodes=2), "--name", "big", "--stop-grace-s", "120")
    jobset = docs["JobSet"]
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}  # retries belong to whoever runs the attempts
    assert jobset["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "big"}
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert (job["completions"], job["parallelism"], job["backoffLimit"], job["completionMode"]) == (2, 2, 0, "Indexed")
    pod = job["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    command = pod["containers"][0]["command"]
    # JobSet names node 0's pod <jobset>-<replicated job>-<job index>-<pod index>, under the subdomain.
    assert {"--master-addr=big-node-0-0.big", "--node-rank=$(NODE_RANK)", "--nnodes=2"} <= set(command)
