"""`recpipe cluster render`: the manifests for one day, checked (names, day, volume, paths) and validated
offline against the vendored CRD and Kubernetes schemas; one training strategy, the project's; every
container with its command and resource requests; the steps written in the order they are applied."""
from __future__ import annotations

import copy
import math
import os
import subprocess
import sys

import pytest
import yaml

from conftest import small_config_dict
from recpipe.common.errors import ConfigError
from recpipe.common.typed_yaml import build_typed
from recpipe.daily import DailyConfig
from recpipe.k8s import ManifestError, RenderOptions, render, validate, write_manifests
from recpipe.trainers.memory import PEAK_BASE, PEAK_PER_STATE

DAY = "2026-01-02"
TRAIN = {"strategy": "ps", "ps_workers": 3, "ps_servers": 2, "np": 4}


def _project(tmp_path, train: dict = TRAIN, root: str = "/data", **extra) -> str:
    """A project YAML (and its config) in tmp_path, its paths under `root`."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(small_config_dict()))
    path = tmp_path / "project.yaml"
    path.write_text(yaml.safe_dump({"log_root": f"{root}/log", "work_root": f"{root}/work",
                                    "export_base": f"{root}/serving", "config": "config.yaml", "train": train,
                                    **extra}))
    return str(path)


def _render(project: str, say=lambda line: None, **options) -> list[dict]:
    return render(RenderOptions(project, options.pop("day", DAY), "reg.example/recpipe:1",
                                **{"volume_claim": "data", **options}), say=say)


def _by_kind(manifests):
    return {m["kind"]: m for m in manifests}


def _pod_specs(m: dict) -> list[dict]:
    """Every pod spec of a manifest (a replica's, a DaskJob's job/worker/scheduler, a Job's template)."""
    spec = m.get("spec", {})
    if m["kind"] == "DaskJob":
        return [spec["job"]["spec"], *(p["spec"] for p in spec["cluster"]["spec"].values())]
    if m["kind"] in ("TFJob", "MPIJob"):
        return [r["template"]["spec"] for r in next(v for k, v in spec.items() if k.endswith("ReplicaSpecs")).values()]
    return [spec["template"]["spec"]] if m["kind"] == "Job" else []


def _containers(manifests):
    for m in manifests:
        for pod in _pod_specs(m):
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                yield m, c


@pytest.mark.unit
@pytest.mark.parametrize("strategy, launcher, kinds", [
    ("local", "hosts", ["Job"]),
    ("ps", "hosts", ["TFJob"]),
    ("horovod", "hosts", ["Job", "Service"]),
    ("horovod", "mpijob", ["MPIJob"])])
def test_render_trains_with_the_project_strategy_alone(tmp_path, strategy, launcher, kinds):
    m = _render(_project(tmp_path, {**TRAIN, "strategy": strategy}), horovod_launcher=launcher)
    components = [x["metadata"]["labels"]["app.kubernetes.io/component"] for x in m]
    assert components == ["config", "preprocess", *["train"] * len(kinds), "publish"]
    assert [x["kind"] for x in m if x["metadata"]["labels"]["app.kubernetes.io/component"] == "train"] == kinds
    data = m[0]["data"]
    dc = build_typed(DailyConfig, yaml.safe_load(data["project.yaml"]))
    assert dc.train.strategy == strategy and dc.config == "/etc/recpipe/config.yaml" and dc.train.hosts is None
    train = m[2]
    if strategy == "ps":
        tf = train["spec"]["tfReplicaSpecs"]
        assert {k: v["replicas"] for k, v in tf.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
        assert "/etc/recpipe/project.yaml" in tf["Chief"]["template"]["spec"]["containers"][0]["args"]
    if strategy == "horovod" and launcher == "mpijob":
        mpi = train["spec"]["mpiReplicaSpecs"]
        launch = mpi["Launcher"]["template"]["spec"]["containers"][0]
        assert mpi["Worker"]["replicas"] == 4 and launch["command"] == ["horovodrun"]
        assert launch["args"][:3] == ["--gloo", "-np", "4"] and launch["args"][5:8] == ["recpipe", "daily", "train"]
    if launcher == "hosts" and strategy == "horovod":
        _check_horovod_hosts(train, m[3], data)
    else:
        assert sorted(data) == ["config.yaml", "project.yaml"]  # no other strategy's variants


def _check_horovod_hosts(job, service, data):
    """Horovod without ssh: pod i of an Indexed Job is host i of `--hosts`, named by a headless Service."""
    name = f"recpipe-train-hosts-{DAY}"
    assert job["metadata"]["name"] == service["metadata"]["name"] == name
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"] == ["recpipe"] and trainer["args"][:4] == [
        "daily", "train", "--project", "/etc/recpipe/project-horovod-host-$(HOST_INDEX).yaml"]
    assert trainer["env"] == [{"name": "HOST_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
    assert pod["spec"]["subdomain"] == name and service["spec"]["selector"] == pod["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    hosts = ",".join(f"{name}-{i}.{name}" for i in range(4))  # an Indexed Job's pod i is named NAME-i
    for i in range(4):
        dc = build_typed(DailyConfig, yaml.safe_load(data[f"project-horovod-host-{i}.yaml"]))
        assert (dc.train.strategy, dc.train.hosts, dc.train.host_index) == ("horovod", hosts, i)
    assert "project-horovod-host-4.yaml" not in data


@pytest.mark.unit
@pytest.mark.parametrize("strategy, launcher", [("local", "hosts"), ("ps", "hosts"), ("horovod", "hosts"),
                                                ("horovod", "mpijob")])
def test_every_container_sets_its_command_and_resource_requests(tmp_path, strategy, launcher):
    """An image with an ENTRYPOINT would run `args` alone as that entrypoint's arguments."""
    manifests = _render(_project(tmp_path, {**TRAIN, "strategy": strategy}), horovod_launcher=launcher)
    containers = list(_containers(manifests))
    assert len(containers) >= 7  # Dask job, worker, scheduler; trainer(s); evaluate, bless, push
    for m, c in containers:
        where = f"{m['kind']} {c['name']}"
        assert c["command"] and c["command"][0] in ("recpipe", "dask", "horovodrun", "/usr/sbin/sshd"), where
        assert c["args"], where
        if c["command"] == ["recpipe"]:
            assert c["args"][0] == "daily" and c["args"][4:6] == ["--day", DAY], where
        assert set(c["resources"]["requests"]) == {"cpu", "memory"}, where
    publish = manifests[-1]["spec"]["template"]["spec"]
    assert [(c["name"], c["args"][1]) for c in [*publish["initContainers"], *publish["containers"]]] == \
        [("evaluate", "evaluate"), ("bless", "bless"), ("push", "push")]  # in turn, in one pod


def _mebibytes(n: float) -> str:
    return f"{math.ceil(n / (1 << 20))}Mi"


@pytest.mark.unit
def test_memory_requests_follow_the_trainers_state_estimate(tmp_path):
    """The state of the tables the config bounds: user_id 1000 hash buckets and item_id's 500 + 2 OOV
    vocabulary slots, 8 wide, float32, with Adagrad's one slot; each PS task holds half of it, the chief and
    the workers none, plus the trainer's per-process base, all with 25% headroom."""
    state = (1000 + 502) * 8 * 4 * 2
    m = _by_kind(_render(_project(tmp_path), dask_threads=3))
    tf = m["TFJob"]["spec"]["tfReplicaSpecs"]
    memory = {k: v["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] for k, v in tf.items()}
    assert memory == {"Chief": _mebibytes(1.25 * PEAK_BASE), "Worker": _mebibytes(1.25 * PEAK_BASE),
                      "PS": _mebibytes(1.25 * (PEAK_BASE + PEAK_PER_STATE * state / 2))}
    publish = m["Job"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert publish == {"cpu": "1", "memory": _mebibytes(1.25 * (PEAK_BASE + PEAK_PER_STATE * state))}
    worker = m["DaskJob"]["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"][0]["resources"]["requests"]
    assert worker == {"cpu": "3", "memory": "4Gi"}  # a Dask worker: its --dask-threads


@pytest.mark.unit
def test_the_projects_resources_override_the_defaults(tmp_path, capsys):
    resources = {"train": {"cpu": 4, "memory": "8Gi"}, "control": {"cpu": 0.25}}
    m = _by_kind(_render(_project(tmp_path, resources=resources), say=print))
    for _, c in _containers([m["TFJob"]]):
        assert c["resources"]["requests"] == {"cpu": "4", "memory": "8Gi"}
    scheduler = m["DaskJob"]["spec"]["cluster"]["spec"]["scheduler"]["spec"]["containers"][0]
    assert scheduler["resources"]["requests"] == {"cpu": "250m", "memory": "2Gi"}
    # the tables whose vocabulary has no max_size are named where the estimate still applies (evaluate)
    out = capsys.readouterr().out
    assert "C1, C2, C3, C4, C5, C6 have vocabularies without max_size" in out and "resources.evaluate.memory" in out
    with pytest.raises(ConfigError, match=r"project\.yaml: resources\.train\.memory: '8GB' is not a Kubernetes"):
        _render(_project(tmp_path, resources={"train": {"memory": "8GB"}}))


@pytest.mark.unit
@pytest.mark.parametrize("change, message", [
    ({"name": "RecPipe_Prod"}, r"^--name 'RecPipe_Prod' is not a valid Kubernetes name for the prefix of every "
                               r"Service's name: it must be a DNS-1035 label \("),
    ({"name": "9recpipe"}, r"^--name '9recpipe' is not a valid Kubernetes name .*starting with a letter"),
    ({"day": "2026-13-45"}, r"^--day '2026-13-45' is not a calendar date YYYY-MM-DD: month must be in 1\.\.12$"),
    ({"day": "2026-02-30"}, r"^--day '2026-02-30' is not a calendar date"),
    ({"day": "20260102"}, r"^--day '20260102' is not a calendar date YYYY-MM-DD: write it YYYY-MM-DD$"),
    ({"volume_claim": None}, r"^--volume-claim: none given, so every pod would read and write log_root, work_root, "
                             r"export_base on a throwaway filesystem of its own"),
    ({"volume_mount": "/shared"}, r"project\.yaml: log_root /data/log is not on a mounted volume \(--volume-claim "
                                  r"data mounts at /shared\)$"),
    ({"volume_claim": "Data"}, r"^--volume-claim 'Data' is not a valid Kubernetes name"),
    ({"namespace": "ml_prod"}, r"^--namespace 'ml_prod' is not a valid Kubernetes name"),
    ({"volume_mount": "/etc"}, r"^--volume-mount '/etc': must be an absolute, normalised folder")])
def test_render_refuses_what_a_cluster_would_not_accept(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        _render(_project(tmp_path), **change)


@pytest.mark.unit
def test_render_refuses_a_name_whose_derived_names_are_too_long(tmp_path):
    """The longest name the operators derive: the DaskJob's scheduler Service, NAME-preprocess-DAY-scheduler."""
    with pytest.raises(ConfigError, match=r"^--name 'r{32}' is too long: the Service the Dask operator creates for "
                                          r"the preprocess job's scheduler 'r{32}-preprocess-2026-01-02-scheduler' "
                                          r"would have 64 characters, over the 63 of a DNS-1035 label; --name may "
                                          r"have at most 31 characters here$"):
        _render(_project(tmp_path), name="r" * 32)
    manifests = _render(_project(tmp_path), name="r" * 31)  # the longest that fits
    assert max(len(m["metadata"]["name"]) for m in manifests) == 31 + len(f"-preprocess-{DAY}")


@pytest.mark.unit
@pytest.mark.parametrize("paths, key", [({"work_root": "/shared/work"}, "work_root /shared/work"),
                                        ({"export_base": "gs://models/ctr"}, "export_base gs://models/ctr"),
                                        ({"log_root": "/data/../log"}, "log_root /data/../log"),
                                        ({"log_root": "log"}, "log_root {tmp}/log")])
def test_render_refuses_a_project_path_off_the_volume(tmp_path, paths, key):
    project = _project(tmp_path)
    data = yaml.safe_load(open(project))
    with open(project, "w") as fh:
        yaml.safe_dump({**data, **paths}, fh)
    with pytest.raises(ConfigError, match=f"^{project}: {key.format(tmp=tmp_path)} is not on a mounted volume "
                                          r"\(--volume-claim data mounts at /data\)$"):
        _render(project)


@pytest.mark.unit
def test_render_refuses_a_strategy_chosen_at_train_time(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.strategy auto is chosen by the advisor .* set local, ps or horovod"):
        _render(_project(tmp_path, {"strategy": "auto"}))


@pytest.mark.unit
def test_the_steps_are_written_in_apply_order(tmp_path):
    written, order = write_manifests(_render(_project(tmp_path)), str(tmp_path / "k8s"))
    rel = [os.path.relpath(p, tmp_path / "k8s") for p in written]
    assert rel == ["0-config/recpipe-project-configmap.yaml", f"1-preprocess/recpipe-preprocess-{DAY}-daskjob.yaml",
                   f"2-train/recpipe-train-ps-{DAY}-tfjob.yaml", f"3-publish/recpipe-publish-{DAY}-job.yaml", "apply.sh"]
    # no manifest at the top: `kubectl apply -f k8s/` cannot start every step at once
    assert not list((tmp_path / "k8s").glob("*.yaml"))
    assert [line.split(":")[0] for line in order] == ["1. config", "2. preprocess", "3. train", "4. publish"]
    assert order[2].endswith(f"then wait until tfjob.kubeflow.org/recpipe-train-ps-{DAY} reports Succeeded")


_FAKE_KUBECTL = """#!/bin/sh
echo "$*" >> "$KUBECTL_LOG"
case "$1 $2" in
  "get $FAIL") echo Failed ;;
  get*) echo Complete Succeeded Successful ;;
esac
"""


@pytest.mark.integration
def test_apply_sh_applies_each_step_after_the_last_finished(tmp_path):
    """apply.sh run against a stand-in kubectl that logs its calls and reports each workload's status."""
    out = tmp_path / "k8s"
    write_manifests(_render(_project(tmp_path), namespace="ml"), str(out), "ml")
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(_FAKE_KUBECTL)
    kubectl.chmod(0o755)
    log = tmp_path / "calls"

    def run(fail: str):
        log.write_text("")
        env = {**os.environ, "KUBECTL": str(kubectl), "KUBECTL_LOG": str(log), "FAIL": fail, "POLL_SECONDS": "0"}
        r = subprocess.run(["sh", str(out / "apply.sh")], env=env, capture_output=True, text=True, timeout=60)
        return r, log.read_text().splitlines()
    wait = ' -o jsonpath={.status.conditions[?(@.status=="True")].type}'
    r, calls = run("none")
    assert r.returncode == 0, r.stderr
    assert calls == ["apply -f 0-config/recpipe-project-configmap.yaml",
                     f"apply -f 1-preprocess/recpipe-preprocess-{DAY}-daskjob.yaml",
                     f"get daskjob.kubernetes.dask.org/recpipe-preprocess-{DAY} --namespace ml -o "
                     "jsonpath={.status.jobStatus}",
                     f"apply -f 2-train/recpipe-train-ps-{DAY}-tfjob.yaml",
                     f"get tfjob.kubeflow.org/recpipe-train-ps-{DAY} --namespace ml" + wait,
                     f"apply -f 3-publish/recpipe-publish-{DAY}-job.yaml",
                     f"get job.batch/recpipe-publish-{DAY} --namespace ml" + wait]
    r, calls = run(f"tfjob.kubeflow.org/recpipe-train-ps-{DAY}")  # training fails: nothing is published
    assert r.returncode == 1 and f"tfjob.kubeflow.org/recpipe-train-ps-{DAY}: Failed" in r.stderr
    assert calls[-1].startswith("get tfjob") and not any("3-publish" in c for c in calls)


@pytest.mark.unit
def test_validator_rejects_what_the_api_server_would(tmp_path):
    horovod = {**TRAIN, "strategy": "horovod"}
    good = {**_by_kind(_render(_project(tmp_path))),
            "MPIJob": _by_kind(_render(_project(tmp_path, horovod), horovod_launcher="mpijob"))["MPIJob"],
            "Service": _by_kind(_render(_project(tmp_path, horovod)))["Service"]}
    cases = []
    bad = copy.deepcopy(good["TFJob"])
    bad["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    cases.append((bad, "spec.tfReplicaSpecs.Worker.template.spec.containers.0"))   # unknown field (strict)
    bad = copy.deepcopy(good["TFJob"])
    bad["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = "two"
    cases.append((bad, "spec.tfReplicaSpecs.PS.replicas"))
    bad = copy.deepcopy(good["TFJob"])
    del bad["spec"]["tfReplicaSpecs"]
    cases.append((bad, "'tfReplicaSpecs' is a required property"))
    bad = copy.deepcopy(good["MPIJob"])
    bad["spec"]["mpiImplementation"] = "MPICH"
    cases.append((bad, "spec.mpiImplementation"))
    bad = copy.deepcopy(good["DaskJob"])
    bad["spec"]["cluster"]["spec"]["worker"]["replicas"] = -1.5
    cases.append((bad, "spec.cluster.spec.worker.replicas"))
    bad = copy.deepcopy(good["ConfigMap"])
    bad["data"]["config.yaml"] = 3
    cases.append((bad, "data.config.yaml"))
    bad = copy.deepcopy(good["Job"])
    bad["spec"]["completions"] = "4"
    cases.append((bad, "spec.completions"))
    bad = copy.deepcopy(good["Job"])
    bad["spec"]["template"]["spec"]["subdomainn"] = "x"
    cases.append((bad, "spec.template.spec"))
    bad = copy.deepcopy(good["Service"])
    bad["spec"]["ports"][0]["port"] = "rendezvous"
    cases.append((bad, "spec.ports.0.port"))
    for manifest, where in cases:
        with pytest.raises(ManifestError, match=where.replace(".", r"\.")):
            validate(manifest)
    with pytest.raises(ManifestError, match="no vendored schema"):
        validate({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "x"}})


@pytest.mark.integration
def test_cli_render_and_daily_options(tmp_path):
    project = _project(tmp_path)
    cmd = [sys.executable, "-m", "recpipe.cli", "cluster", "render", "--project", project, "--day", DAY, "--image",
           "img", "--output", str(tmp_path / "k8s")]
    out = subprocess.run([*cmd, "--volume-claim", "data"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "k8s").glob("*/*.yaml"))) == 4 and out.stdout.count("validated") == 4
    assert f"apply in this order, each step once the one before has finished ({tmp_path}/k8s/apply.sh" in out.stdout
    assert "cluster render:   4. publish: kubectl apply -f" in out.stdout
    refused = subprocess.run([*cmd, "--volume-claim", "data", "--name", "RecPipe_Prod"], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 1 and refused.stderr.startswith(
        "recpipe cluster: error: --name 'RecPipe_Prod' is not a valid Kubernetes name") and \
        refused.stderr.count("\n") == 1, refused.stderr  # one line, no traceback
    wrong = subprocess.run([sys.executable, "-m", "recpipe.cli", "daily", "train", "--project", project, "--day",
                            DAY, "--runner", "dask"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "only `daily preprocess` takes Beam options" in wrong.stderr
