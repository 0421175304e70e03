"""The cluster paths over a real network stack: several hosts are network namespaces on a bridge
(recpipe.bench.netns), each task in its own. PS training from TF_CONFIG across 5 hosts survives a killed
worker and a killed coordinator; a killed PS task, and a worker whose host holds another copy of the data,
are named. Horovod runs one process per host from a host list, no ssh."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from recpipe.bench.netns import VirtualHosts, netns_available
from recpipe.trainers.errors import TrainError
from recpipe.trainers.evaluation.evaluate import evaluate
from recpipe.trainers.model_dir import ModelDir
from recpipe.trainers.strategies.tf_config import tf_config

USABLE, WHY = netns_available()
needs_netns = pytest.mark.skipif(not USABLE, reason=f"network namespaces unavailable: {WHY}")
PORT = 2222


def _train(data, model_dir, *flags):
    return [sys.executable, "-m", "recpipe.cli", "train", "--data", data, "--model-dir", model_dir, *flags]


def _env(cluster: dict, task_type: str, index: int) -> dict:
    return dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}))


def _wait_for_step(model_dir: ModelDir, above: int, proc, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while model_dir.latest_step() <= above:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"no checkpoint after step {above} in {timeout:.0f}s"
        time.sleep(0.3)
    return model_dir.latest_step()


class _Output:
    """A process's output (stdout, with stderr merged into it), read as it comes, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, line: str, timeout: float = 120) -> None:
        """Until the output holds `line`; fails if the process ends or `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while line not in self.text:
            assert self._reader.is_alive(), f"ended ({self.proc.poll()}) without {line!r}: {self.text[-2000:]}"
            assert time.monotonic() < deadline, f"no {line!r} in {timeout:.0f} s: {self.text[-2000:]}"
            time.sleep(0.1)

    def communicate(self, timeout: float) -> str:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.text


def _ps_layout(hosts: VirtualHosts, workers: int) -> tuple[dict, dict]:
    """(TF_CONFIG's cluster, task -> host): the chief on host 0, 2 PS tasks on hosts 1-2, the workers after."""
    cluster = {"chief": [f"{hosts.address(0)}:{PORT}"],
               "ps": [f"{hosts.address(1)}:{PORT}", f"{hosts.address(2)}:{PORT}"],
               "worker": [f"{hosts.address(3 + i)}:{PORT}" for i in range(workers)]}
    return cluster, {("ps", 0): 1, ("ps", 1): 2, **{("worker", i): 3 + i for i in range(workers)}}


@pytest.mark.unit
def test_tf_config_needs_a_routable_chief(monkeypatch):
    cluster = {"worker": ["10.0.0.2:2222"], "ps": ["10.0.0.3:2222"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster}))
    with pytest.raises(TrainError, match="cluster.chief is required"):
        tf_config()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {**cluster, "chief": ["10.0.0.1:2222"]},
                                                "task": {"type": "worker", "index": 3}}))
    with pytest.raises(TrainError, match="task.index 3 is out of range for 1 worker"):
        tf_config()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {**cluster, "chief": ["10.0.0.1:2222"],
                                                            "evaluator": ["10.0.0.9:2222"]}}))
    with pytest.raises(TrainError, match="cluster.evaluator"):
        tf_config()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {**cluster, "chief": ["10.0.0.1:2222"]}}))
    c = tf_config()
    assert c.task_type == "chief" and c.cluster.spec()["chief"] == ["10.0.0.1:2222"]


@pytest.mark.system
@needs_netns
def test_ps_training_across_hosts_survives_worker_and_coordinator_kills(tmp_path, preprocessed, small_cfg_path):
    data, model_dir = preprocessed[0], str(tmp_path / "ps_model")
    md = ModelDir(model_dir)
    with VirtualHosts(5) as hosts:
        cluster, host_of = _ps_layout(hosts, workers=2)
        # Every replica runs the same command, as in a Kubeflow TFJob; TF_CONFIG's task picks the role.
        task_cmd = _train(data, model_dir, "--strategy", "ps")

        def start(task):
            return hosts.popen(host_of[task], task_cmd, env=_env(cluster, *task), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)

        tasks = {task: start(task) for task in host_of}
        for task, proc in tasks.items():
            hosts.wait_listening(host_of[task], PORT, proc=proc)
        chief_cmd = _train(data, model_dir, "--strategy", "ps", "--config", small_cfg_path, "--steps", "500")
        chief = hosts.popen(0, chief_cmd, env=_env(cluster, "chief", 0), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
        first = _wait_for_step(md, 0, chief)
        tasks[("worker", 0)].send_signal(signal.SIGKILL)   # a worker dies mid-run ...
        tasks[("worker", 0)].wait()
        time.sleep(2)
        tasks[("worker", 0)] = start(("worker", 0))          # ... and its manager restarts it, as Kubernetes would
        later = _wait_for_step(md, first, chief)
        chief.send_signal(signal.SIGKILL)                   # the coordinator dies
        chief.wait()
        assert later < 500
        rerun = hosts.run(0, chief_cmd, env=_env(cluster, "chief", 0), capture_output=True, text=True, timeout=900)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        assert f"resuming from {md.checkpoints_dir}/ckpt-{later} at step {later}" in rerun.stdout
        assert f"chief {hosts.address(0)}:{PORT}, 2 workers, 2 PS" in rerun.stdout
        assert md.latest_step() == 500 and md.state().resumed_from == later
        assert "step 500/500" in rerun.stdout and "step 501" not in rerun.stdout
        # exactly the steps run, whatever a lost worker's re-run steps applied: checkpoints at multiples of 50
        assert first % 50 == 0 and later % 50 == 0
        assert all(int(f.split("-")[1].split(".")[0]) % 50 == 0 for f in os.listdir(md.checkpoints_dir)
                   if f.endswith(".index")), os.listdir(md.checkpoints_dir)
        shards = [f for f in os.listdir(md.checkpoints_dir) if ".data-" in f]
        assert len(shards) >= 2  # the variables lived on both PS hosts
    assert evaluate(model_dir, data)["auc"] > 0.6


@pytest.mark.system
@needs_netns
def test_a_ps_task_that_dies_is_named_and_the_job_resumes_once_it_serves_again(tmp_path, preprocessed,
                                                                              small_cfg_path):
    """The coordinator started before a PS task waited for it without a word (for ever, had it not come), and
    a PS task killed mid-run stopped it with "UnavailableError: 0 derived errors ignored. [Op:Identity] name:",
    naming nothing. Now it says which tasks it waits for, and stops naming them after --cluster-wait-seconds;
    and the task that died is named, with the way back (a PS task cannot rejoin: its variables were in its
    memory), which the test then takes."""
    data, model_dir = preprocessed[0], str(tmp_path / "model")
    md = ModelDir(model_dir)
    with VirtualHosts(4) as hosts:
        cluster, host_of = _ps_layout(hosts, workers=1)

        def start(task, wait: bool = True):
            proc = hosts.popen(host_of[task], _train(data, model_dir, "--strategy", "ps"), env=_env(cluster, *task),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if wait:
                hosts.wait_listening(host_of[task], PORT, proc=proc)
            return proc

        tasks = {task: start(task, wait=False) for task in host_of if task != ("ps", 1)}  # they start side by side
        for task, proc in tasks.items():
            hosts.wait_listening(host_of[task], PORT, proc=proc)
        chief_cmd = _train(data, model_dir, "--strategy", "ps", "--config", small_cfg_path, "--steps", "5000")
        chief = hosts.popen(0, chief_cmd, env=_env(cluster, "chief", 0), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
        time.sleep(3)
        tasks[("ps", 1)] = start(("ps", 1))  # as a pod scheduled after the chief's
        first = _wait_for_step(md, 0, chief)
        tasks[("ps", 1)].kill()
        out = chief.communicate(timeout=300)[0]
        assert chief.returncode == 1, out[-2000:]
        ps1 = f"PS task 1 ({hosts.address(2)}:{PORT}: Connection refused)"
        assert f"train: waiting for {ps1} to serve (" in out and "train: every PS and worker task serves" in out, out
        assert (f"recpipe train: error: {ps1} does not answer, so the job stopped: a PS task holds its share of the "
                f"variables in memory and cannot rejoin; once it serves again (its cluster manager restarts it), the "
                f"last checkpoint is step ") in out, out[-2000:]
        gone = hosts.run(0, [*chief_cmd, "--cluster-wait-seconds", "2"], env=_env(cluster, "chief", 0),
                         capture_output=True, text=True, timeout=300)
        assert gone.returncode == 1 and (f"recpipe train: error: {ps1}: not serving after 2 s (--cluster-wait-seconds)"
                                         in gone.stderr), gone.stdout[-1000:] + gone.stderr[-2000:]
        resumed_at = md.latest_step()
        assert resumed_at >= first
        tasks[("ps", 1)] = start(("ps", 1))
        chief_cmd[chief_cmd.index("--steps") + 1] = str(resumed_at + 20)
        rerun = hosts.run(0, chief_cmd, env=_env(cluster, "chief", 0), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert f"resuming from {md.checkpoints_dir}/ckpt-{resumed_at} at step {resumed_at}" in rerun.stdout
    assert md.latest_step() == resumed_at + 20


def _cut_off(hosts: VirtualHosts, host: int) -> float:
    """Host `host`'s link down, its processes alive (a host cut off from the network); when it happened."""
    hosts.run(host, ["ip", "link", "set", "eth0", "down"], check=True)
    return time.monotonic()


@pytest.mark.system
@needs_netns
def test_a_cut_off_worker_is_worked_around_and_a_cut_off_ps_task_is_named(tmp_path, preprocessed, small_cfg_path):
    """A host cut off from the network (its link down, its process alive) fails no RPC: TCP retransmits for
    minutes, and the coordinator hung without a word (240 s seen for a PS task, 150 s for a worker). Now the
    chief probes every task: a worker silent for --task-timeout-seconds is named and its steps run on the
    other worker; a PS task silent as long stops the job, naming the task, its address and the last
    checkpoint."""
    data, model_dir = preprocessed[0], str(tmp_path / "model")
    md = ModelDir(model_dir)
    timeout = 10
    with VirtualHosts(5) as hosts:
        cluster, host_of = _ps_layout(hosts, workers=2)
        tasks = {task: hosts.popen(host, _train(data, model_dir, "--strategy", "ps"), env=_env(cluster, *task),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for task, host in host_of.items()}
        for task, proc in tasks.items():
            hosts.wait_listening(host_of[task], PORT, proc=proc)
        chief = hosts.popen(0, _train(data, model_dir, "--strategy", "ps", "--config", small_cfg_path, "--steps",
                                      "100000", "--task-timeout-seconds", str(timeout)),
                            env=_env(cluster, "chief", 0), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
        out = _Output(chief)
        _wait_for_step(md, 0, chief)
        cut = _cut_off(hosts, host_of[("worker", 0)])
        worker0 = f"worker 0 ({hosts.address(3)}:{PORT}: no answer for "
        out.wait_for(f"train: {worker0}", timeout=timeout + 30)
        worker_named = time.monotonic() - cut
        after = md.latest_step()
        _wait_for_step(md, after + 50, chief, timeout=120)  # the job goes on without the worker
        cut = _cut_off(hosts, host_of[("ps", 1)])
        text = out.communicate(timeout=timeout + 60)
        ps_named = time.monotonic() - cut
    assert chief.returncode == 1, text[-3000:]
    assert f": cut off (--task-timeout-seconds {timeout}); its steps run on the other workers" in text, text[-3000:]
    last = md.latest_step()
    assert (f"recpipe train: error: PS task 1 ({hosts.address(2)}:{PORT}: no answer for " in text and
            f") is cut off, so the job stopped: a PS task holds its share of the variables in memory and cannot "
            f"rejoin; once it serves again (its cluster manager restarts it), the last checkpoint is step {last} in "
            f"{md.checkpoints_dir}" in text), text[-3000:]
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    # probe rounds of up to 4 s each, then for a PS task up to the watch's 30 s grace before the hard exit
    assert worker_named < timeout + 20 and ps_named < timeout + 45, (worker_named, ps_named)
    print(f"worker named {worker_named:.1f} s, PS task stopped the job {ps_named:.1f} s after its host was cut off "
          f"(--task-timeout-seconds {timeout})")


@pytest.mark.system
@needs_netns
@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1) to give a task its own mounts")
def test_a_ps_worker_reading_another_copy_of_the_data_is_named(tmp_path, preprocessed, small_cfg_path):
    """PS workers read the shards at the chief's paths on their own hosts. A worker host holding another copy
    there (a stale one: two item IDs swapped, same sizes) trained the shared tables on IDs that stand for other
    values, without a word; one holding none failed with TensorFlow's trace, and one whose copy lacks the
    shards with a NotFoundError naming a file the chief has (now worker 1 checks its copy against the job's
    shard list before it serves, and stops naming itself). Worker 1 gets its own mounts (unshare), with the
    other copy, an empty folder or a partial copy mounted over the data's path."""
    data = preprocessed[0]
    stale, empty, partial = tmp_path / "stale", tmp_path / "empty", tmp_path / "partial"
    shutil.copytree(data, stale)
    empty.mkdir()
    vocab = stale / "transform" / "vocab" / "item_id.json"
    body = json.loads(vocab.read_text())
    body["values"][:2] = body["values"][1::-1]
    vocab.write_text(json.dumps(body))
    shutil.copytree(data, partial, ignore=shutil.ignore_patterns("*.tfrecord"))
    train_shards = sorted(p.name for p in (Path(data) / "train").glob("*.tfrecord"))

    def mounted(seen: Path, cmd: list[str]) -> list[str]:  # worker 1's filesystem: `seen` at the data's path
        return ["unshare", "--mount", "sh", "-c", f'mount --bind "{seen}" "{data}" && exec "$@"', "sh", *cmd]

    with VirtualHosts(4) as hosts:  # one cluster; worker 1 restarted with each copy, as its manager would
        cluster = {"chief": [f"{hosts.address(0)}:{PORT}"], "ps": [f"{hosts.address(1)}:{PORT}"],
                   "worker": [f"{hosts.address(2)}:{PORT}", f"{hosts.address(3)}:{PORT}"]}
        task_cmd = _train(data, str(tmp_path / "task"), "--strategy", "ps")

        def start(host: int, task: tuple[str, int], seen: Optional[Path] = None) -> subprocess.Popen:
            return hosts.popen(host, task_cmd if seen is None else mounted(seen, task_cmd), env=_env(cluster, *task),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def chief(model_dir: str, *flags: str) -> subprocess.CompletedProcess:
            return hosts.run(0, _train(data, model_dir, "--strategy", "ps", "--config", small_cfg_path, "--steps",
                                       "40", *flags), env=_env(cluster, "chief", 0), capture_output=True, text=True,
                             timeout=600)

        tasks = {1: start(1, ("ps", 0)), 2: start(2, ("worker", 0))}
        for seen, where, why in ((stale, "transform/vocab/item_id.json", " holds other bytes than the same file "
                                                                         "on the chief"),
                                 (empty, "transform/", " is missing")):  # any of its files
            tasks[3] = start(3, ("worker", 1), seen)
            for host, proc in tasks.items():
                hosts.wait_listening(host, PORT, proc=proc)
            model_dir = str(tmp_path / f"model_{seen.name}")
            out = chief(model_dir)
            assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
            assert (f"recpipe train: error: PS worker 1 ({hosts.address(3)}:{PORT}) reads other preprocessed data "
                    f"than the chief at {data}: {data}/{where}" in out.stderr and f"{why}. PS workers read the shards "
                    f"at the chief's paths" in out.stderr), out.stderr[-3000:]
            assert ModelDir(model_dir).latest_step() == 0  # not one step on the other copy
            tasks[3].kill()
            tasks[3].wait()
        # the partial copy: worker 1 checks its own copy whole before it serves, so it never does; the chief
        # sees a worker that does not serve, and says where to look
        worker = hosts.popen(3, mounted(partial, task_cmd), env=_env(cluster, "worker", 1), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out = chief(str(tmp_path / "model_partial"), "--cluster-wait-seconds", "3")
        worker_err = worker.communicate(timeout=300)[1]
    assert out.returncode == 1 and (f"recpipe train: error: worker 1 ({hosts.address(3)}:{PORT}: Connection refused): "
                                    f"not serving after 3 s (--cluster-wait-seconds)" in out.stderr
                                    and "A worker whose own copy of --data is not this run's stops before it "
                                        "serves, naming why in its own log." in out.stderr), out.stderr[-2000:]
    assert worker.returncode == 1, worker_err[-2000:]
    assert (f"recpipe train: error: PS worker 1 ({hosts.address(3)}:{PORT}): {data} holds other shards than its "
            f"preprocess run wrote: its eval/ lacks " in worker_err
            and f"; its train/ lacks {train_shards[0]}" in worker_err), worker_err[-3000:]
    ours = json.loads((Path(data) / "transform" / "vocab" / "item_id.json").read_text())["values"]
    assert ours[:2] == body["values"][1::-1]  # the mounts stayed worker 1's own


@pytest.mark.system
@needs_netns
def test_horovod_across_hosts_without_ssh(tmp_path, preprocessed, small_cfg_path):
    """Three hosts train one model, each starting its own rank; first, one host's copy of the data is partial
    (a copy still going on: a train shard cut short), which read rows twice or never (now that host names it
    before starting its ranks), and the other hosts waited in Gloo's rendezvous for its ranks until Gloo's
    300 s, then died by SIGABRT naming nothing (now every host names it at once)."""
    data, model_dir = preprocessed[0], str(tmp_path / "hvd_model")
    partial = tmp_path / "partial"
    shutil.copytree(data, partial)
    shard = sorted((partial / "train").glob("*.tfrecord"))[-1]
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(size // 2)
    with VirtualHosts(3) as hosts:
        host_list = ",".join(hosts.address(i) for i in range(3))

        def run(data_of: Callable[[int], str]) -> tuple[list[subprocess.Popen], list[str]]:
            procs = [hosts.popen(i, _train(data_of(i), model_dir, "--strategy", "horovod", "--hosts", host_list,
                                           "--host-index", str(i), "--config", small_cfg_path, "--steps", "150",
                                           "--threads", "1"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(3)]
            return procs, [p.communicate(timeout=900)[0] for p in procs]

        # host 2 stops before starting its ranks: it tells the first host's rendezvous store, which stops at
        # once naming it, and host 1, which does not serve the rendezvous, reads the report there and stops too
        t0 = time.monotonic()
        procs, outs = run(lambda i: str(partial) if i == 2 else data)
        assert time.monotonic() - t0 < 120, outs
        assert [p.returncode for p in procs] == [1, 1, 1], outs
        partial_named = (f"{partial} holds other shards than its preprocess run wrote: train/{shard.name} is "
                         f"{size // 2:,} bytes against {size:,}")
        cause = f"host 2 ({hosts.address(2)}) stopped before starting its ranks: {partial_named}"
        assert f"recpipe train: error: {cause}" in outs[0] and "no checkpoint was written yet; a rerun starts " \
            "over" in outs[0], outs[0][-2000:]
        assert (f"recpipe train: error: {cause}" in outs[1] and f"so the job stopped: rank 0 on {hosts.address(0)} "
                f"keeps the run's checkpoints" in outs[1]), outs[1][-2000:]
        assert (f"train: told the first host's rendezvous ({hosts.address(0)}:29500) why the job stopped here"
                in outs[2] and partial_named in outs[2]), outs[2][-2000:]
        procs, outs = run(lambda i: data)
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert [o for o in outs if "Exception in thread" in o or "Traceback" in o] == []  # no launcher traceback
    assert "ranks [0] of 3; rendezvous 10.78.0.1:29500" in outs[0] and "(10.78.0.2, eth0)" in outs[1]
    assert "step 150/150" in outs[0] and "3 ranks" in outs[0]
    state = ModelDir(model_dir).state()
    assert state.ranks == 3 and state.steps_done == 150
    assert sorted(f for f in os.listdir(ModelDir(model_dir).checkpoints_dir) if f.endswith(".index")) == \
        ["ckpt-100.index", "ckpt-150.index", "ckpt-50.index"]  # rank 0 alone wrote them
    assert evaluate(model_dir, data)["auc"] > 0.6  # 0.64 measured: 150 steps of 3 x 128 rows


@pytest.mark.system
@needs_netns
def test_the_rendered_horovod_hosts_job_trains_across_hosts(tmp_path, preprocessed, small_cfg_path):
    """`recpipe cluster render`'s Indexed Job for Horovod without ssh, run as Kubernetes would run it: pod i's
    container args with its $(HOST_INDEX) expanded and the ConfigMap's files at their mount, each pod on a
    host of its own sharing one work folder (the volume), its name known to the others only once it starts
    (the headless Service's DNS), the last pod first."""
    import yaml
    from recpipe.k8s import MOUNT, RenderOptions, render
    day = "2026-01-05"
    shutil.copytree(preprocessed[0], tmp_path / "work" / day / "preprocessed")
    project = tmp_path / "project.yaml"
    project.write_text(yaml.safe_dump({"log_root": str(tmp_path / "log"), "work_root": str(tmp_path / "work"),
                                       "export_base": str(tmp_path / "serving"), "config": small_cfg_path,
                                       "train": {"strategy": "horovod", "np": 2, "threads": 1, "steps": 30}}))
    rendered = render(RenderOptions(str(project), day, "img", volume_claim="data", volume_mount=str(tmp_path)))
    manifests = {m["kind"]: m for m in rendered}
    mount = tmp_path / "etc-recpipe"
    mount.mkdir()
    for key, text in manifests["ConfigMap"]["data"].items():
        (mount / key).write_text(text.replace(MOUNT, str(mount)))
    job = next(m for m in rendered if m["kind"] == "Job")  # the first Job trains; the last publishes
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["recpipe"]
    service = manifests["Service"]["metadata"]["name"]
    names = {i: f"{job['metadata']['name']}-{i}.{service}" for i in range(job["spec"]["completions"])}
    waiting = f"waiting for the first host's rendezvous ({names[0]}:29500)"
    with VirtualHosts(len(names)) as hosts:
        procs = {}
        for i in sorted(names, reverse=True):
            for j in names:
                hosts.know(j, {i: names[i]})
            args = [a.replace("$(HOST_INDEX)", str(i)).replace(MOUNT, str(mount)) for a in container["args"]]
            procs[i] = _Output(hosts.popen(i, [sys.executable, "-m", "recpipe.cli", *args], stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, cwd="/"))
            if i:  # the next pod starts once this one waits for the first's rendezvous
                procs[i].wait_for(waiting)
        outs = {i: p.communicate(timeout=600) for i, p in procs.items()}
    assert all(p.proc.returncode == 0 for p in procs.values()), outs
    assert waiting in outs[1], outs[1]
    state = ModelDir(str(tmp_path / "work" / day / "model")).state()
    assert state.ranks == 2 and state.steps_done == 30, state


@pytest.mark.system
@needs_netns
def test_a_restarted_host_waits_out_the_last_attempts_end(tmp_path, preprocessed, small_cfg_path):
    """The first host serves a stopped attempt's report until every host has read it (up to 30 s). A host
    started meanwhile (a Kubernetes pod's container restarted) read that report and stopped at once, spending
    one of its Job's retries, as often as it restarted within those 30 s; it now waits for the first host's
    next attempt."""
    data = preprocessed[0]
    with VirtualHosts(2) as hosts:
        host_list = f"{hosts.address(0)},{hosts.address(1)}"

        def start(i: int, data_dir: str) -> subprocess.Popen:
            return hosts.popen(i, _train(data_dir, str(tmp_path / f"m{i}"), "--strategy", "horovod", "--hosts",
                                         host_list, "--host-index", str(i), "--config", small_cfg_path, "--steps",
                                         "20", "--threads", "1"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
        failing = _Output(start(0, str(tmp_path / "missing")))
        failing.wait_for("serving the rendezvous until host 1")  # its report, served until host 1 has read it
        time.sleep(8)  # a report stored over 5 s before a host's command started is an earlier attempt's
        late = _Output(start(1, data))  # reads that report, 8 s old (before: stopped by it)
        first_out = failing.communicate(timeout=120)
        assert failing.proc.returncode == 1, first_out
        again = _Output(start(0, data))
        outs = [again.communicate(timeout=600), late.communicate(timeout=600)]
    assert again.proc.returncode == 0 and late.proc.returncode == 0, outs
    assert (f"train: the first host's rendezvous ({hosts.address(0)}:29500) still serves an attempt that stopped "
            in outs[1] and f"before this command started (host 0 ({hosts.address(0)}) stopped before starting its "
            f"ranks: {tmp_path / 'missing'}: not a `recpipe preprocess` output") in outs[1], outs[1]
    assert ModelDir(str(tmp_path / "m0")).state().ranks == 2


def _two_hosts(args: list[Optional[list[str]]], timeout: int = 600, host_env: tuple[dict, dict] = ({}, {}),
               host_0_after: Optional[str] = None, during: Optional[Callable[[list], None]] = None,
               names: Optional[tuple[str, str]] = None, **env) -> tuple[list[int], list[str]]:
    """`recpipe train --strategy horovod` on 2 virtual hosts, each with its own arguments (None: the command
    is not run there) and `host_env`, from outside the source tree (`python -m` puts the working folder first
    on the path); with `host_0_after`, host 0 starts only once host 1's output holds it; `during(processes)`
    once all have started; (exit codes, outputs), None for a host that ran nothing. With `names`, --hosts lists
    them, and every host resolves a host's name from when that host starts, as a cluster's DNS learns a pod's."""
    with VirtualHosts(2) as hosts:
        host_list = ",".join(names or [hosts.address(i) for i in range(2)])
        procs: list[Optional[_Output]] = [None, None]
        for i in (1, 0) if host_0_after else (0, 1):
            for j in range(2) if names else ():
                hosts.know(j, {i: names[i]})
            if args[i] is not None:
                procs[i] = _Output(hosts.popen(i, [sys.executable, "-m", "recpipe.cli", "train", "--strategy",
                                                   "horovod", "--hosts", host_list, "--host-index", str(i),
                                                   "--threads", "1", *args[i]],
                                               env=dict(os.environ, **env, **host_env[i]), stdout=subprocess.PIPE,
                                               stderr=subprocess.STDOUT, text=True, cwd="/"))
            if i == 1 and host_0_after:
                procs[1].wait_for(host_0_after)
        try:
            if during is not None:
                during([p and p.proc for p in procs])
            outs = [p and p.communicate(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                if p is not None:
                    p.proc.kill()
    return [p and p.proc.returncode for p in procs], outs


@pytest.mark.system
@needs_netns
def test_horovod_hosts_must_train_one_model_and_resume_from_rank_0(tmp_path, preprocessed, small_cfg_path):
    """Hosts with their own disks and model dirs: a host whose copy of the data is another run's (a stale copy
    at the same path, another day's) numbered the values otherwise, and the averaged gradients trained each
    row on other values by rank, without a word (now every host names it; the ranks' other checks, of their
    config and code, are recpipe.trainers.strategies.hvd._check_ranks_train_one_model's, in test_strategies.py, and of a partial
    copy, in test_horovod_across_hosts_without_ssh); a resume hung, since only rank 0's model dir holds
    checkpoints, so the other ranks started over and looped more steps than rank 0; a rank killed mid-run was
    named by no host; a host whose command failed before starting its ranks left the others to die by SIGABRT
    after Gloo's 300 s, naming nothing; and a host started a few seconds before the first one died by SIGABRT
    at once (its ranks found no rendezvous), as did every other host when the first one failed, naming
    nothing."""
    data = preprocessed[0]
    stale = tmp_path / "stale"
    shutil.copytree(data, stale)
    vocab = stale / "transform" / "vocab" / "C1.json"
    body = json.loads(vocab.read_text())
    body["values"][:2] = body["values"][1::-1]
    vocab.write_text(json.dumps(body))

    def own(run: str, i: int, steps: int = 20, data_dir: str = data) -> list[str]:
        return ["--data", data_dir, "--config", small_cfg_path, "--model-dir", str(tmp_path / f"{run}_{i}"),
                "--steps", str(steps)]
    codes, outs = _two_hosts([own("a", 0), own("a", 1, data_dir=str(stale))])
    assert codes == [1, 1], outs
    for out in outs:
        assert (f"the ranks read data of different preprocess runs: rank 1 (host 10.78.0.2, {stale}): the "
                f"vocabularies differ, against rank 0 (host 10.78.0.1, {data}); " in out and "a whole copy" in out), \
            out[-3000:]

    # the first host starts only once the other waits for its rendezvous, and the hosts are named (before,
    # the other's rank's Gloo client gave up after a few refused connections and died by SIGABRT; a name that
    # did not resolve yet failed at once); then a rank is killed mid-run (the kernel's OOM killer): every host
    # names it, not the collective errors the other ranks see ("rank 0 died (exit code 1: UnknownError:
    # [[{{node HorovodGroupedAllreduce_...}}]])" before), and a host without rank 0 says where the checkpoints
    # are ("no checkpoint was written yet" before)
    def kill_rank_1(procs: list) -> None:
        import psutil
        _wait_for_step(ModelDir(str(tmp_path / "c_0")), 0, procs[0])
        for rank in psutil.Process(procs[1].pid).children(recursive=True):
            rank.kill()
    codes, outs = _two_hosts([own("c", i, 5000) for i in range(2)], names=("trainer-a", "trainer-b"),
                             host_0_after="train: waiting for the first host's rendezvous", during=kill_rank_1)
    assert codes == [1, 1], outs
    assert ("train: waiting for the first host's rendezvous (trainer-a:29500) to answer (0 s of up to 300): "
            "is `recpipe train ... --host-index 0` on trainer-a running?") in outs[1], outs[1]
    assert "ranks [1] of 2; rendezvous trainer-a:29500" in outs[1]
    assert ("recpipe train: error: horovod rank 1 on trainer-b died (killed by SIGKILL), so the job stopped: the last "
            "checkpoint is step ") in outs[0] and f"{tmp_path / 'c_0' / 'checkpoints'}; rerun" in outs[0], \
        outs[0][-2000:]
    assert ("recpipe train: error: horovod rank 1 on trainer-b died (killed by SIGKILL), so the job stopped: rank 0 "
            "on trainer-a keeps the run's checkpoints in its own --model-dir; rerun the same command on every host "
            "to resume") in outs[1], outs[1][-2000:]
    # the rerun resumes: rank 0 from its checkpoint, rank 1 from rank 0's weights
    last = ModelDir(str(tmp_path / "c_0")).latest_step()
    codes, outs = _two_hosts([own("c", i, last + 20) for i in range(2)])
    assert codes == [0, 0], outs
    assert f"resuming from {tmp_path / 'c_0' / 'checkpoints'}/ckpt-{last} at step {last}" in outs[0]
    assert ModelDir(str(tmp_path / "c_0")).latest_step() == last + 20
    assert not ModelDir(str(tmp_path / "c_1")).latest_step()
    with pytest.raises(TrainError) as kept:  # rank 1's own model dir says where the checkpoints are
        evaluate(str(tmp_path / "c_1"), data)
    assert (f"c_1: no checkpoint here: this host's Horovod ranks trained with rank 0 on 10.78.0.1, which kept the "
            f"run's checkpoints (step {last + 20}) in its own --model-dir {tmp_path / 'c_0'}; evaluate and export "
            f"there" in str(kept.value)), kept.value

    # the first host goes down mid-run (its launcher and ranks killed): the other names the silent rendezvous
    def kill_host_0(procs: list) -> None:
        import psutil
        _wait_for_step(ModelDir(str(tmp_path / "z_0")), 0, procs[0])
        launcher = psutil.Process(procs[0].pid)
        for p in [launcher, *launcher.children(recursive=True)]:
            p.kill()
    codes, outs = _two_hosts([own("z", i, 5000) for i in range(2)], during=kill_host_0)
    assert codes[1] == 1 and ("; the first host's rendezvous (10.78.0.1:29500) does not answer either: is `recpipe "
                              "train ... --host-index 0` on 10.78.0.1 still running, and its host up?, so the job "
                              "stopped: rank 0 on 10.78.0.1 keeps") in outs[1], outs[1][-2000:]

    # the first host stops before starting its ranks: it serves its own report until the other host has read it
    # (a host other than the first that stops so: test_horovod_across_hosts_without_ssh)
    missing = tmp_path / "missing"
    t0 = time.monotonic()
    codes, outs = _two_hosts([own("g", 0, data_dir=str(missing)), own("g", 1)])
    assert time.monotonic() - t0 < 120, outs
    assert codes == [1, 1], outs
    assert "train: serving the rendezvous until host 1 (10.78.0.2) read that the job stopped (up to 30 s)" in outs[0]
    assert (f"recpipe train: error: host 0 (10.78.0.1) stopped before starting its ranks: {missing}: not a `recpipe "
            f"preprocess` output" in outs[1] and "so the job stopped: rank 0 on 10.78.0.1 keeps the run's "
            "checkpoints" in outs[1]), outs[1][-2000:]

    # one host's command never runs: Gloo's timeout, given by HOROVOD_GLOO_TIMEOUT_SECONDS, is how long the other
    # host waits. Both cases at once, neither host finding the other: host 1's command waits on another
    # --rendezvous-port, which no first host serves, so it says so after its timeout; host 0's first rank says
    # which rank it waits for, until Gloo's timeout
    codes, outs = _two_hosts([own("d", 0), [*own("h", 1), "--rendezvous-port", "29501"]],
                             host_env=({"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}, {"HOROVOD_GLOO_TIMEOUT_SECONDS": "3"}))
    assert codes[1] == 1 and ("recpipe train: error: the first host's rendezvous (10.78.0.1:29501) did not answer in "
                              "3 s (HOROVOD_GLOO_TIMEOUT_SECONDS): is `recpipe train ... --host-index 0` on 10.78.0.1 "
                              "running, or did it stop before serving it (its own output says why)?, so the job "
                              "stopped: ") in outs[1], outs[1][-2000:]
    assert codes[0] == 1
    assert ("train: waiting for rank 1 (host 1, 10.78.0.2) to join Gloo's rendezvous (" in outs[0]
            and " s since rank 0 joined): is `recpipe train ... --host-index N` running there?" in outs[0]), outs[0]
    assert ("horovod rank 0 on 10.78.0.1 died (killed by SIGABRT: Gloo's rendezvous waited 10 s for rank(s) 1, which "
            "never joined (HOROVOD_GLOO_TIMEOUT_SECONDS); is `recpipe train ... --host-index 1` running on 10.78.0.2, "
            "or did it stop before starting its ranks (its own output says why)?)") in outs[0], outs[0][-2000:]


def _rank_pid(launcher: subprocess.Popen, timeout: float = 120) -> int:
    """The pid of the rank a Horovod launcher (one slot) started: its child running `recpipe.cli train`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmd = fh.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == launcher.pid and b"recpipe.cli\0train" in cmd:
                return int(entry)
        time.sleep(0.2)
    raise AssertionError(f"no rank under launcher {launcher.pid} in {timeout:.0f} s")


@pytest.mark.system
@needs_netns
def test_a_horovod_job_restarts_itself_after_a_rank_is_killed_twice(tmp_path, preprocessed, small_cfg_path):
    """A dead rank stopped every host, and recovery meant rerunning every host's command. With
    --max-restarts 2, each host's launcher starts its ranks again from rank 0's last checkpoint (the first
    host serving a new rendezvous): a rank killed twice, the job completes with exactly --steps steps and
    checkpoints at its multiples, both restarts logged on both hosts, and an AUC within noise of an undisturbed
    run's."""
    data = preprocessed[0]
    steps = 300

    def launchers(hosts: VirtualHosts, model_dir: str, restarts: int) -> list[_Output]:
        host_list = ",".join(hosts.address(i) for i in range(2))
        return [_Output(hosts.popen(i, _train(data, model_dir, "--strategy", "horovod", "--hosts", host_list,
                                              "--host-index", str(i), "--config", small_cfg_path, "--steps",
                                              str(steps), "--threads", "1", "--max-restarts", str(restarts)),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                for i in range(2)]

    with VirtualHosts(2) as hosts:
        calm = str(tmp_path / "calm")
        outs = [o.communicate(timeout=600) for o in launchers(hosts, calm, 0)]
        assert [ModelDir(calm).state().steps_done, *(o.count("train: restart ") for o in outs)] == [steps, 0, 0], outs
        model_dir = str(tmp_path / "restarted")
        md = ModelDir(model_dir)
        procs = launchers(hosts, model_dir, 2)
        for n in (1, 2):
            _wait_for_step(md, md.latest_step(), procs[0].proc)
            os.kill(_rank_pid(procs[1].proc), signal.SIGKILL)
            for p in procs:
                p.wait_for(f"train: restart {n} of 2 (--max-restarts) after horovod rank 1 on {hosts.address(1)} died "
                           f"(killed by SIGKILL", timeout=120)
        outs = [p.communicate(timeout=600) for p in procs]
    assert [p.proc.returncode for p in procs] == [0, 0], outs
    assert [o for o in outs if "Exception in thread" in o or "Traceback" in o] == []
    state = md.state()
    assert state.steps_done == steps and state.resumed_from and state.resumed_from % 50 == 0, state
    assert sorted(int(f[5:-6]) for f in os.listdir(md.checkpoints_dir) if f.endswith(".index"))[-1] == steps
    assert all(int(f[5:-6]) % 50 == 0 for f in os.listdir(md.checkpoints_dir) if f.endswith(".index"))
    auc, calm_auc = evaluate(model_dir, data)["auc"], evaluate(calm, data)["auc"]
    assert abs(auc - calm_auc) < 0.03, (auc, calm_auc)
    print(f"AUC {auc:.4f} after 2 restarts vs {calm_auc:.4f} undisturbed")


@pytest.mark.system
@needs_netns
def test_a_ps_job_restarts_itself_once_a_lost_ps_task_serves_again(tmp_path, preprocessed, small_cfg_path):
    """A PS task killed mid-run stopped the job until a human reran the chief. With --max-restarts 1 the chief's
    attempt stops naming the task, and the chief starts the next attempt, which waits for the task to serve
    again (here restarted as its cluster manager would) and resumes from the last checkpoint to exactly
    --steps."""
    data, model_dir = preprocessed[0], str(tmp_path / "model")
    md = ModelDir(model_dir)
    with VirtualHosts(4) as hosts:
        cluster, host_of = _ps_layout(hosts, workers=1)

        def start(task):
            return hosts.popen(host_of[task], _train(data, model_dir, "--strategy", "ps"), env=_env(cluster, *task),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tasks = {task: start(task) for task in host_of}
        for task, proc in tasks.items():
            hosts.wait_listening(host_of[task], PORT, proc=proc)
        chief = _Output(hosts.popen(0, _train(data, model_dir, "--strategy", "ps", "--config", small_cfg_path,
                                              "--steps", "300", "--max-restarts", "1"),
                                    env=_env(cluster, "chief", 0), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True))
        first = _wait_for_step(md, 0, chief.proc)
        tasks[("ps", 1)].kill()
        tasks[("ps", 1)].wait()
        chief.wait_for("train: restart 1 of 1 (the attempt was stopped by the fault above)", timeout=120)
        tasks[("ps", 1)] = start(("ps", 1))
        out = chief.communicate(timeout=600)
    assert chief.proc.returncode == 0, out[-3000:]
    assert (f"recpipe train: error: PS task 1 ({hosts.address(2)}:{PORT}: Connection refused) does not answer, so "
            f"the job stopped" in out), out[-3000:]
    assert f"at step {md.state().resumed_from}" in out and md.state().resumed_from >= first, out[-3000:]
    assert md.state().steps_done == 300 and "step 300/300" in out and "step 301" not in out, out[-3000:]
    assert all(int(f[5:-6]) % 50 == 0 for f in os.listdir(md.checkpoints_dir) if f.endswith(".index"))
