"""`recpipe cluster render`: Kubernetes manifests for one day of the pipeline, from the project YAML,
each validated offline against the vendored schemas (recpipe/k8s_schemas, see SOURCES.md).

One step after another (recpipe.k8s_order writes them as folders and an `apply.sh`): a ConfigMap holding
the project and feature config (mounted at /etc/recpipe); a dask-kubernetes `DaskJob` running the
preprocess step on a Dask cluster the operator starts (`--runner dask --dask-address
$(DASK_SCHEDULER_ADDRESS)`); the project's training strategy (train.strategy), one of: a batch `Job` of one
pod (local); a Kubeflow `TFJob` (ps: chief/worker/ps replicas; the operator sets TF_CONFIG, which `recpipe
train` follows); Horovod as an Indexed `Job` whose pods are the hosts of `recpipe train --hosts` (pod i
reads the project variant naming it host i; the pods find one another by the names a headless `Service`
gives them, and may start in any order), or with `horovod_launcher="mpijob"` as an `MPIJob` (v2beta1: the
launcher runs `horovodrun --gloo` over the hostfile the operator writes; workers run sshd); and a `Job`
running evaluate, bless and push in turn. Every pod runs the same image and `recpipe daily STEP`, so warm
start, vocabulary continuity and idempotence are the daily pipeline's own.

Before writing anything the render refuses (recpipe.k8s_checks) a name Kubernetes or an operator would
reject, a day that is not a date, and project paths off the volume every pod mounts (`--volume-claim`).
Each container sets its command and arguments, and requests the CPU and memory of recpipe.k8s_resources.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Callable, Literal, Optional

import yaml

from recpipe.common.errors import ConfigError
from recpipe.daily import DailyConfig, load_daily_config
from recpipe.features.config import config_to_dict, load_config
from recpipe.k8s_checks import (DNS1035_LABEL, DNS1123_LABEL, DNS1123_SUBDOMAIN, LABEL_VALUE, ManifestError, NameUse,
                                check_day, check_mount, check_names, check_paths, validate)
from recpipe.k8s_order import plan_steps, write_steps
from recpipe.k8s_resources import PodRequests

__all__ = ["RenderOptions", "render", "validate", "write_manifests", "ManifestError"]

MOUNT = "/etc/recpipe"


@dataclass(frozen=True)
class RenderOptions:
    project: str                    # the daily project YAML
    day: str                        # YYYY-MM-DD
    image: str                      # an image with recpipe on its PATH (and sshd, for the MPIJob workers)
    name: str = "recpipe"
    namespace: Optional[str] = None
    volume_claim: Optional[str] = None   # a PVC holding the project's log/work/export paths
    volume_mount: str = "/data"
    dask_workers: int = 4
    dask_threads: int = 2
    # train.strategy horovod: hosts, an Indexed Job + headless Service (no ssh, no operator); mpijob, an MPIJob
    horovod_launcher: Literal["hosts", "mpijob"] = "hosts"


# ------------------------------------------------------------------------- names
# how the project's strategy trains -> the infix of its training object's name
_TRAIN = {"local": "train", "ps": "train-ps", "mpijob": "train-horovod", "hosts": "train-hosts"}


def _training(o: RenderOptions, run) -> str:
    """How the project trains: local, ps, hosts (Horovod's Indexed Job) or mpijob."""
    return o.horovod_launcher if run.strategy == "horovod" else run.strategy


def _name_uses(o: RenderOptions, run, kind: str, names: dict[str, str]) -> list[NameUse]:
    """The names made from --name, each with the rule Kubernetes or the operator creating it applies."""
    n = o.name
    uses = [NameUse("the prefix of every Service's name", n, DNS1035_LABEL),
            NameUse("the label value app.kubernetes.io/instance", n, LABEL_VALUE),
            NameUse("the ConfigMap", names["config"], DNS1123_SUBDOMAIN)]
    dask = names["preprocess"]
    uses += [NameUse("the Service the Dask operator creates for the preprocess job's scheduler", f"{dask}-scheduler",
                     DNS1035_LABEL),
             NameUse("the label value dask.org/workergroup-name the Dask operator sets", f"{dask}-default",
                     LABEL_VALUE)]
    train = names["train"]
    if kind == "ps":
        uses += [NameUse(f"the Service the TFJob operator creates for {role} {i}", f"{train}-{role}-{i}",
                         DNS1035_LABEL)
                 for role, i in (("chief", 0), ("worker", run.ps_workers - 1), ("ps", run.ps_servers - 1))]
    elif kind == "mpijob":
        uses += [NameUse("the MPIJob's headless Service", train, DNS1035_LABEL),
                 NameUse(f"the hostname the MPI operator gives worker {run.np - 1}", f"{train}-worker-{run.np - 1}",
                         DNS1123_LABEL),
                 NameUse("the launcher Job the MPI operator creates", f"{train}-launcher", DNS1123_LABEL)]
    elif kind == "hosts":
        uses += [NameUse("the headless Service naming the Horovod hosts", train, DNS1035_LABEL),
                 NameUse(f"the hostname of Horovod host {run.np - 1}", f"{train}-{run.np - 1}", DNS1123_LABEL)]
    else:
        uses.append(NameUse("the training Job (its label job-name)", train, DNS1123_LABEL))
    uses.append(NameUse("the evaluate/bless/push Job (its label job-name)", names["publish"], DNS1123_LABEL))
    return uses


def _check(o: RenderOptions, dc: DailyConfig, names: dict[str, str]) -> None:
    """Refuse, in one line naming the option or project key, what a cluster would not accept or run."""
    check_mount(o.volume_mount, MOUNT)
    if o.namespace is not None:
        check_names("--namespace", o.namespace, [NameUse("the namespace", o.namespace, DNS1123_LABEL)])
    if o.volume_claim is not None:
        check_names("--volume-claim", o.volume_claim,
                    [NameUse("the PersistentVolumeClaim", o.volume_claim, DNS1123_SUBDOMAIN)])
    if o.horovod_launcher not in ("hosts", "mpijob"):
        raise ConfigError(f"--horovod-launcher {o.horovod_launcher!r}: must be hosts or mpijob")
    for option, value in (("--dask-workers", o.dask_workers), ("--dask-threads", o.dask_threads)):
        if value < 1:
            raise ConfigError(f"{option} {value}: must be at least 1")
    if dc.train.strategy == "auto":
        raise ConfigError(f"{o.project}: train.strategy auto is chosen by the advisor when the day's data is "
                          f"preprocessed, but a cluster's pods are fixed before; set local, ps or horovod "
                          f"(`recpipe advise` says which)")
    check_names("--name", o.name, _name_uses(o, dc.train, _training(o, dc.train), names))
    check_paths(o.project, {"log_root": dc.log_root, "work_root": dc.work_root, "export_base": dc.export_base},
                o.volume_claim, o.volume_mount)


# ------------------------------------------------------------------------- pods
def _meta(o: RenderOptions, name: str, component: str) -> dict:
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "recpipe", "app.kubernetes.io/instance": o.name,
                                     "app.kubernetes.io/component": component}}
    if o.namespace:
        meta["namespace"] = o.namespace
    return meta


def _container(o: RenderOptions, name: str, argv: list[str], resources: dict) -> dict:
    """argv[0] is the container's command (whatever the image's ENTRYPOINT), the rest its arguments."""
    mounts = [{"name": "recpipe-project", "mountPath": MOUNT, "readOnly": True}]
    if o.volume_claim:
        mounts.append({"name": "data", "mountPath": o.volume_mount})
    return {"name": name, "image": o.image, "command": argv[:1], "args": argv[1:], "resources": resources,
            "volumeMounts": mounts}


def _pod(o: RenderOptions, container: str, argv: list[str], resources: dict, ports: Optional[list] = None) -> dict:
    volumes = [{"name": "recpipe-project", "configMap": {"name": f"{o.name}-project"}}]
    if o.volume_claim:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": o.volume_claim}})
    c = _container(o, container, argv, resources)
    if ports:
        c["ports"] = copy.deepcopy(ports)
    return {"spec": {"containers": [c], "volumes": volumes}}


def _daily(step: str, project: str, day: str) -> list[str]:
    return ["recpipe", "daily", step, "--project", f"{MOUNT}/{project}", "--day", day]


def _host_variant(i: int | str) -> str:
    """The project variant of host i of the Horovod job without ssh (i: an index, or the pod's $(HOST_INDEX))."""
    return f"project-horovod-host-{i}.yaml"


def _project_variants(dc: DailyConfig, hosts: list[str]) -> dict[str, str]:
    """project.yaml, and one variant per host of the Horovod job without ssh (`hosts`), by their file name in
    the mount."""
    run = dataclasses.replace(dc.train, hosts=None, host_index=0)
    variants = [("project.yaml", run)]
    variants += [(_host_variant(i), dataclasses.replace(run, hosts=",".join(hosts), host_index=i))
                 for i in range(len(hosts))]
    out = {}
    for key, variant in variants:
        train = {k: v for k, v in dataclasses.asdict(variant).items() if v is not None}
        out[key] = yaml.safe_dump({"log_root": dc.log_root, "work_root": dc.work_root, "export_base": dc.export_base,
                                   "config": f"{MOUNT}/config.yaml", "train": train,
                                   "bless_tolerance": dc.bless_tolerance}, sort_keys=False)
    return out


# ------------------------------------------------------------------------- rendering
def render(o: RenderOptions, say: Callable[[str], None] = lambda line: None) -> list[dict]:
    """One day's manifests, checked and validated, in the order they are applied.

    Args:
        o: the render's options.
        say: prints a note (what the memory estimate leaves out).

    Returns:
        The manifests: the ConfigMap, the preprocess DaskJob, the project's training strategy, the
        evaluate/bless/push Job; each labelled app.kubernetes.io/component with its step.

    Raises:
        ConfigError: a name, the day, the volume, a path or the strategy a cluster would not accept or run.
        ManifestError: a manifest its schema rejects.
    """
    day = check_day(o.day)
    dc = load_daily_config(o.project)
    run = dc.train
    kind = _training(o, run)
    names = {"config": f"{o.name}-project", "preprocess": f"{o.name}-preprocess-{day}",
             "train": f"{o.name}-{_TRAIN.get(kind, 'train')}-{day}", "publish": f"{o.name}-publish-{day}"}
    _check(o, dc, names)
    cfg = load_config(dc.config)
    req = PodRequests(dc.resources, cfg, o.dask_threads)
    hosts = [f"{names['train']}-{i}.{names['train']}" for i in range(run.np)] if kind == "hosts" else []
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(o, names["config"], "config"),
                  "data": {"config.yaml": yaml.safe_dump(config_to_dict(cfg), sort_keys=False),
                           **_project_variants(dc, hosts)}}
    train = {"local": _train_local, "ps": _train_ps, "mpijob": _train_mpi, "hosts": _train_hosts}[kind]
    manifests = [config_map, _preprocess(o, names["preprocess"], req), *train(o, run, names["train"], req),
                 _publish(o, names["publish"], req)]
    for m in manifests:
        validate(m)
    note = req.note()
    if note:
        say(f"cluster render: note: {note}")
    return manifests


def _preprocess(o: RenderOptions, name: str, req: PodRequests) -> dict:
    """The DaskJob: its client runs `recpipe daily preprocess` on the Dask cluster the operator starts."""
    port = [{"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"}]
    client = [*_daily("preprocess", "project.yaml", o.day), "--runner", "dask", "--dask-address",
              "$(DASK_SCHEDULER_ADDRESS)"]
    worker = ["dask", "worker", "--name", "$(DASK_WORKER_NAME)", "--nthreads", str(o.dask_threads)]
    service = {"type": "ClusterIP", "selector": {"dask.org/cluster-name": name, "dask.org/component": "scheduler"},
               "ports": [{"name": "tcp-comm", "protocol": "TCP", "port": 8786, "targetPort": "tcp-comm"}]}
    return {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskJob", "metadata": _meta(o, name, "preprocess"),
            "spec": {"job": _pod(o, "job", client, req.control()),
                     "cluster": {"spec": {
                         "worker": {"replicas": o.dask_workers, **_pod(o, "worker", worker, req.preprocess())},
                         "scheduler": {**_pod(o, "scheduler", ["dask", "scheduler"], req.control(), port),
                                       "service": service}}}}}


def _job(o: RenderOptions, name: str, component: str, pod: dict, completions: int = 1) -> dict:
    """A batch Job running `pod` to completion (`completions` pods at once), each restarted in place on failure."""
    pod["spec"]["restartPolicy"] = "OnFailure"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(o, name, component),
            "spec": {"completions": completions, "parallelism": completions, "backoffLimit": 3, "template": pod}}


def _train_local(o: RenderOptions, run, name: str, req: PodRequests) -> list[dict]:
    """train.strategy local: one pod, one training process holding the whole model."""
    return [_job(o, name, "train", _pod(o, "trainer", _daily("train", "project.yaml", o.day), req.train(1.0)))]


def _train_ps(o: RenderOptions, run, name: str, req: PodRequests) -> list[dict]:
    """train.strategy ps: a TFJob. Each PS task holds its share of the tables; the chief and workers none."""
    port = [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
    argv = _daily("train", "project.yaml", o.day)

    def replicas(n: int, share: float) -> dict:  # a dead task is restarted and rejoins; a chief resumes
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": _pod(o, "tensorflow", argv, req.train(share), port)}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": _meta(o, name, "train"),
             "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                      "tfReplicaSpecs": {"Chief": replicas(1, 0.0), "Worker": replicas(run.ps_workers, 0.0),
                                         "PS": replicas(run.ps_servers, 1 / run.ps_servers)}}}]


def _train_mpi(o: RenderOptions, run, name: str, req: PodRequests) -> list[dict]:
    """train.strategy horovod under the MPI operator: each worker runs one rank holding the whole model."""
    launcher = _pod(o, "launcher", ["horovodrun", "--gloo", "-np", str(run.np), "--hostfile", "/etc/mpi/hostfile",
                                    *_daily("train", "project.yaml", o.day)], req.control())
    return [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _meta(o, name, "train"),
             "spec": {"slotsPerWorker": 1, "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                      "mpiReplicaSpecs": {
                          "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": launcher},
                          "Worker": {"replicas": run.np, "restartPolicy": "OnFailure",
                                     "template": _pod(o, "worker", ["/usr/sbin/sshd", "-De"], req.train(1.0))}}}}]


def _train_hosts(o: RenderOptions, run, name: str, req: PodRequests) -> list[dict]:
    """Horovod without ssh: an Indexed Job of train.np pods, pod i running `recpipe daily train` on the
    project variant that makes it host i of `--hosts` (its index from the Job's annotation), and the headless
    Service under which pod i's hostname NAME-i resolves (NAME-i.NAME, also before it is ready: the hosts
    look each other up while they start). Pods may start in any order: the others wait for the first host's
    rendezvous. A pod that fails restarts in place; the job stops on every host, and the same command
    resumes from rank 0's last checkpoint on the shared volume."""
    port = run.rendezvous_port
    selector = {"recpipe.dev/train-hosts": name}
    pod = _pod(o, "trainer", _daily("train", _host_variant("$(HOST_INDEX)"), o.day), req.train(1.0),
               [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}])
    pod["metadata"] = {"labels": selector}
    pod["spec"]["subdomain"] = name
    pod["spec"]["containers"][0]["env"] = [{"name": "HOST_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    job = _job(o, name, "train", pod, run.np)
    job["spec"]["completionMode"] = "Indexed"
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o, name, "train"),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                        "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}]}}
    return [job, service]


def _publish(o: RenderOptions, name: str, req: PodRequests) -> dict:
    """One pod running evaluate and bless as init containers, in turn, then push."""
    pod = _pod(o, "push", _daily("push", "project.yaml", o.day), req.evaluate())
    pod["spec"]["initContainers"] = [_container(o, step, _daily(step, "project.yaml", o.day), req.evaluate())
                                     for step in ("evaluate", "bless")]
    return _job(o, name, "publish", pod)


def write_manifests(manifests: list[dict], out_dir: str, namespace: Optional[str] = None,
                    title: str = "recpipe cluster render") -> tuple[list[str], list[str]]:
    """Write the manifests one folder per step, in apply order, and `apply.sh`, which applies each step once
    the one before has finished (recpipe.k8s_order).

    Args:
        manifests: from render.
        out_dir: the output folder (created when missing).
        namespace: the manifests' namespace, for the script's status reads (None: kubectl's current one).
        title: what the manifests run, for the script's first comment.

    Returns:
        (the files written, apply.sh last; the apply order as lines for a reader).
    """
    return write_steps(plan_steps(manifests), out_dir, namespace, title)
