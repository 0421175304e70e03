"""Vendor the JSON schemas `recpipe cluster render` validates its manifests against (offline) into
recpipe/k8s_schemas/. Run once by a maintainer (needs pip's registry), then commit the output:

    .venv/bin/python scripts/vendor_k8s_schemas.py

Sources (see recpipe/k8s_schemas/SOURCES.md for versions and licences):
  - Kubernetes' own JSON schemas (PodTemplateSpec, ConfigMap, Job, Service and everything they reference), from the
    kubernetes-validate wheel (generated from the Kubernetes OpenAPI spec);
  - the DaskCluster and DaskJob CRDs' openAPIV3Schema, from the dask-kubernetes wheel (its Helm CRDs);
  - Kubeflow's TFJob (kubeflow.org/v1) and MPIJob (kubeflow.org/v2beta1) CRDs: their structure outside
    the pod template is transcribed below from the CRD YAML at the commits named; the pod template
    is Kubernetes' PodTemplateSpec (the CRDs inline controller-gen's expansion of that same type).
Descriptions are dropped (they are most of the bytes); everything else is kept as published.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "recpipe" / "k8s_schemas"
K8S = "v1.33.0-local-strict"
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"
DASK_KUBERNETES = "dask-kubernetes==2026.3.0"
DEFS_ID = "https://kubernetes.io/api/_definitions.json"
POD_TEMPLATE = {"$ref": f"{DEFS_ID}#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}

_SCHEDULING = {"type": "object", "properties": {
    "minAvailable": {"type": "integer", "format": "int32"},
    "minResources": {"type": "object", "additionalProperties": {
        "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True,
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"}},
    "priorityClass": {"type": "string"}, "queue": {"type": "string"},
    "scheduleTimeoutSeconds": {"type": "integer", "format": "int32"}}}
_RUN_POLICY = {"type": "object", "properties": {
    "activeDeadlineSeconds": {"type": "integer", "format": "int64"},
    "backoffLimit": {"type": "integer", "format": "int32"},
    "cleanPodPolicy": {"type": "string"},
    "schedulingPolicy": _SCHEDULING,
    "suspend": {"type": "boolean", "default": False},
    "ttlSecondsAfterFinished": {"type": "integer", "format": "int32"}}}
_REPLICA = {"type": "object", "properties": {
    "replicas": {"type": "integer", "format": "int32"},
    "restartPolicy": {"type": "string"},
    "template": POD_TEMPLATE}}


def _resource(api_version: str, kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
        "apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": {"type": "object"},
        "spec": spec, "status": {"type": "object"}}}


# kubeflow/training-operator manifests/base/crds/kubeflow.org_tfjobs.yaml @ 07a4a89697d80501695ae59f2d9a22aa27fd5044
TFJOB = _resource("kubeflow.org/v1", "TFJob", {"type": "object", "required": ["tfReplicaSpecs"], "properties": {
    "enableDynamicWorker": {"type": "boolean"},
    "runPolicy": _RUN_POLICY,
    "successPolicy": {"type": "string"},
    "tfReplicaSpecs": {"type": "object", "additionalProperties": _REPLICA}}})
# kubeflow/mpi-operator manifests/base/kubeflow.org_mpijobs.yaml @ 013fa15b22a60180c99f5111a904b60099828f89
MPIJOB = _resource("kubeflow.org/v2beta1", "MPIJob", {"type": "object", "required": ["mpiReplicaSpecs"], "properties": {
    "mpiImplementation": {"type": "string", "enum": ["OpenMPI", "Intel"], "default": "OpenMPI"},
    "mpiReplicaSpecs": {"type": "object", "additionalProperties": _REPLICA},
    "runPolicy": _RUN_POLICY,
    "slotsPerWorker": {"type": "integer", "format": "int32", "default": 1},
    "sshAuthMountPath": {"type": "string", "default": "/root/.ssh"},
    "waitForWorkers": {"type": "boolean", "default": False}}})


def _strip(node):
    """Drop descriptions; OpenAPI's `nullable: true` becomes JSON Schema's null type."""
    if isinstance(node, dict):
        out = {k: _strip(v) for k, v in node.items() if k != "description"}
        if out.pop("nullable", False) and "type" in out:
            out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
        return out
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v.rsplit("/", 1)[-1]
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _download(spec: str, into: str) -> zipfile.ZipFile:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", spec, "-d", into], check=True)
    name = spec.split("==")[0].replace("-", "_")
    return zipfile.ZipFile(next(Path(into).glob(f"{name}-*.whl")))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        kv = _download(KUBERNETES_VALIDATE, tmp)
        defs = json.loads(kv.read(f"kubernetes_validate/kubernetes-json-schema/{K8S}/_definitions.json"))["$defs"]
        keep, stack = set(), ["io.k8s.api.core.v1.PodTemplateSpec", "io.k8s.api.core.v1.ConfigMap",
                              "io.k8s.api.batch.v1.Job", "io.k8s.api.core.v1.Service"]
        while stack:
            name = stack.pop()
            if name not in keep:
                keep.add(name)
                stack.extend(_refs(defs[name]))
        definitions = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": DEFS_ID,
                       "$defs": {k: _strip(defs[k]) for k in sorted(keep)}}
        (OUT / "kubernetes-definitions.json").write_text(json.dumps(definitions, sort_keys=True))
        (OUT / "LICENSE-kubernetes-validate").write_bytes(
            kv.read(next(n for n in kv.namelist() if n.endswith("licenses/LICENSE"))))
        dk = _download(DASK_KUBERNETES, tmp)
        for name, kind in (("daskcluster", "DaskCluster"), ("daskjob", "DaskJob")):
            crd = yaml.safe_load(dk.read(f"dask_kubernetes/operator/deployment/helm/dask-kubernetes-operator/crds/{name}.yaml"))
            version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
            schema = _strip(version["schema"]["openAPIV3Schema"])
            schema["properties"]["apiVersion"] = {"const": "kubernetes.dask.org/v1"}
            schema["properties"]["kind"] = {"const": kind}
            (OUT / f"{name}-v1.json").write_text(json.dumps(schema, sort_keys=True))
        (OUT / "LICENSE-dask-kubernetes").write_bytes(
            dk.read(next(n for n in dk.namelist() if n.endswith("licenses/LICENSE"))))
    (OUT / "tfjob-v1.json").write_text(json.dumps(TFJOB, sort_keys=True))
    (OUT / "mpijob-v2beta1.json").write_text(json.dumps(MPIJOB, sort_keys=True))
    print(f"wrote {sorted(p.name for p in OUT.iterdir())}")


if __name__ == "__main__":
    main()
