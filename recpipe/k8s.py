"""`recpipe cluster render`: Kubernetes manifests for one day of the pipeline, from the project YAML,
each validated offline against the vendored schemas (recpipe/k8s_schemas, see SOURCES.md).

Written to OUT/: a ConfigMap holding the project and feature config (mounted at /etc/recpipe), a
dask-kubernetes `DaskJob` running the preprocess step on a Dask cluster the operator starts
(`--runner dask --dask-address $(DASK_SCHEDULER_ADDRESS)`), a Kubeflow `TFJob` for PS training
(chief/worker/ps replicas; the operator sets TF_CONFIG, which `recpipe train` follows) and an
`MPIJob` (v2beta1) for Horovod (the launcher runs `horovodrun --gloo` over the hostfile the operator
writes; workers run sshd). Every pod runs the same image and `recpipe daily STEP`, so warm start,
vocabulary continuity and idempotence are the daily pipeline's own. The project's data paths must be
on storage every pod mounts at the same path (`--volume-claim`).
"""
from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import yaml

from features.config import config_to_dict, load_config
from features.errors import RecpipeError
from recpipe.daily import DailyConfig, load_daily_config

__all__ = ["RenderOptions", "render", "validate", "write_manifests", "ManifestError"]

SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
MOUNT = "/etc/recpipe"
_SCHEMA_FILES = {("v1", "ConfigMap"): None, ("kubeflow.org/v1", "TFJob"): "tfjob-v1.json",
                 ("kubeflow.org/v2beta1", "MPIJob"): "mpijob-v2beta1.json",
                 ("kubernetes.dask.org/v1", "DaskJob"): "daskjob-v1.json",
                 ("kubernetes.dask.org/v1", "DaskCluster"): "daskcluster-v1.json"}


class ManifestError(RecpipeError, ValueError):
    pass


@dataclass(frozen=True)
class RenderOptions:
    project: str                    # the daily project YAML
    day: str                        # YYYY-MM-DD
    image: str                      # an image with recpipe installed (and sshd, for the MPIJob workers)
    name: str = "recpipe"
    namespace: Optional[str] = None
    volume_claim: Optional[str] = None   # a PVC holding the project's log/work/model paths
    volume_mount: str = "/data"
    dask_workers: int = 4
    dask_threads: int = 2


# ------------------------------------------------------------------------- validation
@lru_cache(maxsize=None)
def _validator(api_version: str, kind: str):
    import jsonschema
    from referencing import Registry, Resource
    definitions = json.loads((SCHEMAS / "kubernetes-definitions.json").read_text())
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    name = _SCHEMA_FILES.get((api_version, kind), "missing")
    if name is None:  # a core resource: its definition in the Kubernetes file
        schema = {"$ref": f"{definitions['$id']}#/$defs/io.k8s.api.core.{api_version}.{kind}"}
    elif name == "missing":
        raise ManifestError(f"{api_version} {kind}: no vendored schema to validate it against")
    else:
        schema = json.loads((SCHEMAS / name).read_text())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(manifest: dict) -> None:
    """Raise ManifestError naming the first field the schema rejects."""
    errors = sorted(_validator(manifest.get("apiVersion", ""), manifest.get("kind", "")).iter_errors(manifest),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ManifestError(f"{manifest['kind']} {manifest.get('metadata', {}).get('name')}: {where}: {e.message}")


# ------------------------------------------------------------------------- rendering
def _meta(o: RenderOptions, name: str, component: str) -> dict:
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "recpipe", "app.kubernetes.io/instance": o.name,
                                     "app.kubernetes.io/component": component}}
    if o.namespace:
        meta["namespace"] = o.namespace
    return meta


def _pod(o: RenderOptions, container: str, args: list[str], ports: Optional[list] = None) -> dict:
    mounts = [{"name": "recpipe-project", "mountPath": MOUNT, "readOnly": True}]
    volumes = [{"name": "recpipe-project", "configMap": {"name": f"{o.name}-project"}}]
    if o.volume_claim:
        mounts.append({"name": "data", "mountPath": o.volume_mount})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": o.volume_claim}})
    c = {"name": container, "image": o.image, "args": args, "volumeMounts": mounts}
    if ports:
        c["ports"] = ports
    return {"spec": {"containers": [c], "volumes": volumes}}


def _daily(step: str, project: str, day: str) -> list[str]:
    return ["recpipe", "daily", step, "--project", f"{MOUNT}/{project}", "--day", day]


def _project_variants(dc: DailyConfig) -> dict[str, str]:
    """project.yaml and one variant per training strategy, their config path inside the mount."""
    out = {}
    for key, strategy in (("project.yaml", dc.train.strategy), ("project-ps.yaml", "ps"),
                          ("project-horovod.yaml", "horovod")):
        train = {k: v for k, v in dataclasses.asdict(dataclasses.replace(dc.train, strategy=strategy)).items()
                 if v is not None}
        out[key] = yaml.safe_dump({"log_root": dc.log_root, "work_root": dc.work_root, "model_base": dc.model_base,
                                   "config": f"{MOUNT}/config.yaml", "train": train,
                                   "bless_tolerance": dc.bless_tolerance}, sort_keys=False)
    return out


def render(o: RenderOptions) -> list[dict]:
    dc = load_daily_config(o.project)
    cfg = load_config(dc.config)
    run, day = dc.train, o.day
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(o, f"{o.name}-project", "config"),
                  "data": {"config.yaml": yaml.safe_dump(config_to_dict(cfg), sort_keys=False),
                           **_project_variants(dc)}}
    dask_port = [{"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"}]
    dask_job = {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskJob",
                "metadata": _meta(o, f"{o.name}-preprocess-{day}", "preprocess"),
                "spec": {"job": _pod(o, "job", [*_daily("preprocess", "project.yaml", day), "--runner", "dask",
                                                 "--dask-address", "$(DASK_SCHEDULER_ADDRESS)"]),
                         "cluster": {"spec": {
                             "worker": {"replicas": o.dask_workers, **_pod(o, "worker", [
                                 "dask", "worker", "--name", "$(DASK_WORKER_NAME)", "--nthreads",
                                 str(o.dask_threads)])},
                             "scheduler": {**_pod(o, "scheduler", ["dask", "scheduler"], dask_port),
                                           "service": {"type": "ClusterIP", "ports": [
                                               {"name": "tcp-comm", "protocol": "TCP", "port": 8786,
                                                "targetPort": "tcp-comm"}],
                                               "selector": {"dask.org/cluster-name": f"{o.name}-preprocess-{day}",
                                                            "dask.org/component": "scheduler"}}}}}}}
    tf_port = [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
    tf_pod = _pod(o, "tensorflow", _daily("train", "project-ps.yaml", day), tf_port)
    tfjob = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _meta(o, f"{o.name}-train-ps-{day}", "train"),
             "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                      "tfReplicaSpecs": {
                          # a dead worker or PS is restarted and rejoins; a restarted chief resumes from its checkpoint
                          "Chief": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(tf_pod)},
                          "Worker": {"replicas": run.ps_workers, "restartPolicy": "OnFailure",
                                     "template": copy.deepcopy(tf_pod)},
                          "PS": {"replicas": run.ps_servers, "restartPolicy": "OnFailure",
                                 "template": copy.deepcopy(tf_pod)}}}}
    ranks = run.np
    launcher = _pod(o, "launcher", ["horovodrun", "--gloo", "-np", str(ranks), "--hostfile", "/etc/mpi/hostfile",
                                    *_daily("train", "project-horovod.yaml", day)])
    mpijob = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
              "metadata": _meta(o, f"{o.name}-train-horovod-{day}", "train"),
              "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                       "mpiReplicaSpecs": {
                           "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": launcher},
                           "Worker": {"replicas": ranks, "restartPolicy": "OnFailure",
                                      "template": _pod(o, "worker", ["/usr/sbin/sshd", "-De"])}}}}
    manifests = [config_map, dask_job, tfjob, mpijob]
    for m in manifests:
        validate(m)
    return manifests


def write_manifests(manifests: list[dict], out_dir: str) -> list[str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for m in manifests:
        path = out / f"{m['metadata']['name']}-{m['kind'].lower()}.yaml"
        path.write_text(yaml.safe_dump(m, sort_keys=False))
        written.append(str(path))
    return written
