"""`recpipe cluster render`: the manifests for one day, validated offline against the vendored CRD
and Kubernetes schemas; the validator rejects what the API server would."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from conftest import small_config_dict
from recpipe.common.typed_yaml import build_typed
from recpipe.daily import DailyConfig
from recpipe.k8s import ManifestError, RenderOptions, render, validate


def _project(tmp_path) -> str:
    """A project YAML (and its config) in tmp_path that trains on 3 PS workers, 2 PS and 4 Horovod ranks."""
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(small_config_dict()))
    path = tmp_path / "project.yaml"
    path.write_text(yaml.safe_dump({"log_root": "/data/log", "work_root": "/data/work", "export_base": "/data/serving",
                                    "config": "config.yaml",
                                    "train": {"strategy": "ps", "ps_workers": 3, "ps_servers": 2, "np": 4}}))
    return str(path)


def _by_kind(manifests):
    return {m["kind"]: m for m in manifests}


@pytest.mark.unit
def test_render_writes_every_engine_from_one_project(tmp_path):
    m = _by_kind(render(RenderOptions(_project(tmp_path), "2026-01-02", "reg.example/recpipe:1", volume_claim="data")))
    assert set(m) == {"ConfigMap", "DaskJob", "TFJob", "MPIJob", "Job", "Service"}
    tf = m["TFJob"]["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in tf.items()} == {"Chief": 1, "Worker": 3, "PS": 2}
    chief = tf["Chief"]["template"]["spec"]["containers"][0]
    assert chief["name"] == "tensorflow" and chief["args"][:3] == ["recpipe", "daily", "train"]
    assert "/etc/recpipe/project-ps.yaml" in chief["args"] and "2026-01-02" in chief["args"]
    mpi = m["MPIJob"]["spec"]["mpiReplicaSpecs"]
    assert mpi["Worker"]["replicas"] == 4 and mpi["Launcher"]["template"]["spec"]["containers"][0]["args"][:4] == \
        ["horovodrun", "--gloo", "-np", "4"]
    job = m["DaskJob"]["spec"]["job"]["spec"]["containers"][0]["args"]
    assert job[-4:] == ["--runner", "dask", "--dask-address", "$(DASK_SCHEDULER_ADDRESS)"]
    data = m["ConfigMap"]["data"]
    for key, strategy in (("project.yaml", "ps"), ("project-ps.yaml", "ps"), ("project-horovod.yaml", "horovod")):
        dc = build_typed(DailyConfig, yaml.safe_load(data[key]))
        assert dc.train.strategy == strategy and dc.config == "/etc/recpipe/config.yaml" and dc.train.np == 4
    assert yaml.safe_load(data["config.yaml"])["name"] == "small_ctr"
    # Horovod without ssh: pod i of an Indexed Job is host i of `--hosts`, named by a headless Service
    name = "recpipe-train-hosts-2026-01-02"
    job, service = m["Job"], m["Service"]
    assert job["metadata"]["name"] == service["metadata"]["name"] == name
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]
    trainer = pod["spec"]["containers"][0]
    assert trainer["args"][:5] == ["recpipe", "daily", "train", "--project",
                                   "/etc/recpipe/project-horovod-host-$(HOST_INDEX).yaml"]
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
def test_validator_rejects_what_the_api_server_would(tmp_path):
    good = _by_kind(render(RenderOptions(_project(tmp_path), "2026-01-02", "img")))
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
    out = subprocess.run([sys.executable, "-m", "recpipe.cli", "cluster", "render", "--project", project, "--day",
                          "2026-01-02", "--image", "img", "--output", str(tmp_path / "k8s")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "k8s").glob("*.yaml"))) == 6 and out.stdout.count("validated") == 6
    wrong = subprocess.run([sys.executable, "-m", "recpipe.cli", "daily", "train", "--project", project, "--day",
                            "2026-01-02", "--runner", "dask"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "only `daily preprocess` takes Beam options" in wrong.stderr
