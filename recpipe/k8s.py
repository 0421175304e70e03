"""`recpipe cluster render`: Kubernetes manifests for one day of the pipeline, from the project YAML,
each validated offline against the vendored schemas (recpipe/k8s_schemas, see SOURCES.md).

Written to OUT/: a ConfigMap holding the project and feature config (mounted at /etc/recpipe), a
dask-kubernetes `DaskJob` running the preprocess step on a Dask cluster the operator starts
(`--runner dask --dask-address $(DASK_SCHEDULER_ADDRESS)`), a Kubeflow `TFJob` for PS training
(chief/worker/ps replicas; the operator sets TF_CONFIG, which `recpipe train` follows), an
`MPIJob` (v2beta1) for Horovod (the launcher runs `horovodrun --gloo` over the hostfile the operator
writes; workers run sshd), and Horovod without ssh or an operator: an Indexed `Job` whose pods are the
hosts of `recpipe train --hosts` (pod i reads the project variant naming it host i; the pods find one
another by the names a headless `Service` gives them, and may start in any order). Every pod runs the
same image and `recpipe daily STEP`, so warm start,
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

from recpipe.features.config import config_to_dict, load_config
from recpipe.common.errors import RecpipeError
from recpipe.daily import DailyConfig, load_daily_config

__all__ = ["RenderOptions", "render", "validate", "write_manifests", "ManifestError"]

SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
MOUNT = "/etc/recpipe"
# core resources: their definition in kubernetes-definitions.json; custom resources: their own schema file
_DEFINITIONS = {("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap", ("v1", "Service"): "io.k8s.api.core.v1.Service",
                ("batch/v1", "Job"): "io.k8s.api.batch.v1.Job"}
_SCHEMA_FILES = {("kubeflow.org/v1", "TFJob"): "tfjob-v1.json",
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
    if (api_version, kind) in _DEFINITIONS:
        schema = {"$ref": f"{definitions['$id']}#/$defs/{_DEFINITIONS[api_version, kind]}"}
    elif (api_version, kind) in _SCHEMA_FILES:
        schema = json.loads((SCHEMAS / _SCHEMA_FILES[api_version, kind]).read_text())
    else:
        raise ManifestError(f"{api_version} {kind}: no vendored schema to validate it against")
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


def _host_variant(i: int | str) -> str:
    """The project variant of host i of the Horovod job without ssh (i: an index, or the pod's $(HOST_INDEX))."""
    return f"project-horovod-host-{i}.yaml"


def _project_variants(dc: DailyConfig, hosts: list[str]) -> dict[str, str]:
    """project.yaml, one variant per training strategy, and one per host of the Horovod job without ssh
    (`hosts`), their config path inside the mount."""
    out = {}
    run = dataclasses.replace(dc.train, hosts=None, host_index=0)
    variants = [("project.yaml", dc.train), ("project-ps.yaml", dataclasses.replace(run, strategy="ps")),
                ("project-horovod.yaml", dataclasses.replace(run, strategy="horovod"))]
    variants += [(_host_variant(i), dataclasses.replace(run, strategy="horovod", hosts=",".join(hosts), host_index=i))
                 for i in range(len(hosts))]
    for key, variant in variants:
        train = {k: v for k, v in dataclasses.asdict(variant).items() if v is not None}
        out[key] = yaml.safe_dump({"log_root": dc.log_root, "work_root": dc.work_root, "export_base": dc.export_base,
                                   "config": f"{MOUNT}/config.yaml", "train": train,
                                   "bless_tolerance": dc.bless_tolerance}, sort_keys=False)
    return out


def render(o: RenderOptions) -> list[dict]:
    dc = load_daily_config(o.project)
    cfg = load_config(dc.config)
    run, day = dc.train, o.day
    hosts_name = f"{o.name}-train-hosts-{day}"  # the Indexed Job's, and its headless Service's
    hosts = [f"{hosts_name}-{i}.{hosts_name}" for i in range(run.np)]  # pod i's hostname . the Service
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(o, f"{o.name}-project", "config"),
                  "data": {"config.yaml": yaml.safe_dump(config_to_dict(cfg), sort_keys=False),
                           **_project_variants(dc, hosts)}}
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
    tfjob = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
             "metadata": _meta(o, f"{o.name}-train-ps-{day}", "train"),
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
    manifests = [config_map, dask_job, tfjob, mpijob,
                 *_horovod_hosts(o, run.rendezvous_port, hosts_name, len(hosts))]
    for m in manifests:
        validate(m)
    return manifests


def _horovod_hosts(o: RenderOptions, port: int, name: str, n: int) -> list[dict]:
    """Horovod without ssh: an Indexed Job of n pods, pod i running `recpipe daily train` on the project
    variant that makes it host i of `--hosts` (its index from the Job's annotation), and the headless
    Service under which pod i's hostname NAME-i resolves (NAME-i.NAME, also before it is ready: the
    hosts look each other up while they start). Pods may start in any order: the others wait for the
    first host's rendezvous. A pod that fails restarts in place; the job stops on every host, and the
    same command resumes from rank 0's last checkpoint on the shared volume."""
    selector = {"recpipe.dev/train-hosts": name}
    pod = _pod(o, "trainer", _daily("train", _host_variant("$(HOST_INDEX)"), o.day),
               [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}])
    pod["metadata"] = {"labels": selector}
    pod["spec"].update(subdomain=name, restartPolicy="OnFailure")
    pod["spec"]["containers"][0]["env"] = [{"name": "HOST_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(o, name, "train"),
           "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 3,
                    "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, name, "train"),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                        "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}]}}
    return [job, service]


def write_manifests(manifests: list[dict], out_dir: str) -> list[str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for m in manifests:
        path = out / f"{m['metadata']['name']}-{m['kind'].lower()}.yaml"
        path.write_text(yaml.safe_dump(m, sort_keys=False))
        written.append(str(path))
    return written
