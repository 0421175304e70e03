"""The cluster suite: PS and Horovod across hosts (network namespaces on a bridge, recpipe.bench.netns) at
several link speeds (tc tbf), against the advisor's predictions (recpipe.trainers.advisor).

Per repetition and link setting (unshaped veth, then shaped): the link's goodput between two hosts;
PS training (chief + 2 PS + 2 workers, one task per host, one thread each) and Horovod (2 hosts, one
rank each, one thread); the per-worker step time from the steady ex/s. The advisor's model
(recpipe.trainers.advisor.step_times) is then used two ways: uncalibrated, as `recpipe advise` predicts
without measurements across hosts (its local compute probe + bytes over the link's goodput), and
calibrated: plus the per-step overhead (the CPU communication takes, round trips, the cluster's
slower compute) measured on the unshaped link. The overheads are written to cluster.json, which
`recpipe advise --calibration` reads. Ratio keys: the calibrated model's relative error per
strategy and shaped speed (target <= 0.25).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import yaml

from recpipe.features.config import load_config
from recpipe.common.errors import RecpipeError
from recpipe.bench.common import CLI, generate_once, preprocess_once, summary
from recpipe.bench.scaleout import traffic_inputs
from recpipe.bench.netns import VirtualHosts, netns_available
from recpipe.common import fsio
from recpipe.trainers.advisor import Overheads, link_bytes, step_times
from recpipe.trainers.model_dir import ModelDir

__all__ = ["ClusterBenchOptions", "bench_cluster", "markdown", "overheads_from"]

PORT = 2222
_SINK = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         "s.bind(('0.0.0.0', 5201)); s.listen()\nwhile True:\n    c, _ = s.accept()\n"
         "    while c.recv(1 << 20):\n        pass\n    c.close()\n")
_SEND = ("import socket, sys, time\nc = socket.create_connection((sys.argv[1], 5201)); n = int(sys.argv[2])\n"
         "t = time.perf_counter(); c.sendall(b'x' * n); c.shutdown(socket.SHUT_WR); c.recv(1)\n"
         "print(n / (time.perf_counter() - t))")


@dataclass(frozen=True)
class ClusterBenchOptions:
    rows: int = 100_000
    steps: int = 60
    reps: int = 3
    rates: tuple = (None, "1gbit", "100mbit")   # None: the unshaped link (the calibration)
    quick: bool = False


def _goodput(hosts: VirtualHosts, megabytes: int) -> float:
    """Bytes/s of one TCP stream from host 0 to host 1."""
    sink = hosts.popen(1, [sys.executable, "-c", _SINK], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hosts.wait_listening(1, 5201, proc=sink)
    out = hosts.run(0, [sys.executable, "-c", _SEND, hosts.address(1), str(megabytes << 20)], capture_output=True,
                    text=True, check=True, timeout=600).stdout
    sink.kill()
    return float(out.strip())


def _train(data: str, model_dir: str, cfg_path: str, steps: int, *flags: str) -> list[str]:
    return [*CLI, "train", "--data", data, "--model-dir", model_dir, "--config", cfg_path, "--steps", str(steps),
            *flags]


def _ps_step_s(rate, data, cfg_path, steps, batch, work, say) -> tuple[float, float]:
    """(seconds per worker step, link goodput bytes/s) of chief + 2 PS + 2 workers on 5 hosts."""
    model_dir = os.path.join(work, f"ps-{rate}-{time.time_ns()}")
    with VirtualHosts(5, rate=rate) as hosts:
        goodput = _goodput(hosts, 64 if rate != "100mbit" else 16)
        cluster = {"chief": [f"{hosts.address(0)}:{PORT}"], "ps": [f"{hosts.address(i)}:{PORT}" for i in (1, 2)],
                   "worker": [f"{hosts.address(i)}:{PORT}" for i in (3, 4)]}

        def env(kind, index):
            return dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}))

        # every task at once, then wait for each to listen: one after another, each waited out the others'
        # TensorFlow start-up (about 10 s of every PS run)
        tasks = {host: hosts.popen(host, [*CLI, "train", "--strategy", "ps", "--data", data, "--model-dir",
                                          model_dir, "--ps-task-threads", "1"], env=env(kind, index),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for host, (kind, index) in zip((1, 2, 3, 4), (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)))}
        for host, proc in tasks.items():
            hosts.wait_listening(host, PORT, proc=proc)
        run = hosts.run(0, _train(data, model_dir, cfg_path, steps, "--strategy", "ps", "--threads", "1"),
                        env=env("chief", 0), capture_output=True, text=True, timeout=3600)
        if run.returncode != 0:
            raise RecpipeError(f"bench cluster: PS at {rate or 'unshaped'} failed: {run.stderr.strip()[-500:]}")
    rate_ex = ModelDir(model_dir).state().examples_per_sec_steady
    say(f"bench cluster: PS 2 workers + 2 PS, link {rate or 'unshaped'} ({goodput * 8 / 1e6:,.0f} Mbit/s): "
        f"{rate_ex:,.0f} ex/s")
    return 2 * batch / rate_ex, goodput


def _horovod_step_s(rate, data, cfg_path, steps, batch, work, say) -> tuple[float, float]:
    """(seconds per rank step, link goodput bytes/s) of 2 Horovod ranks on 2 hosts, no ssh."""
    model_dir = os.path.join(work, f"hvd-{rate}-{time.time_ns()}")
    with VirtualHosts(2, rate=rate) as hosts:
        goodput = _goodput(hosts, 64 if rate != "100mbit" else 16)
        host_list = f"{hosts.address(0)},{hosts.address(1)}"
        procs = [hosts.popen(i, _train(data, model_dir, cfg_path, steps, "--strategy", "horovod", "--hosts",
                                       host_list, "--host-index", str(i), "--threads", "1"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
        outs = [p.communicate(timeout=3600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RecpipeError(f"bench cluster: Horovod at {rate or 'unshaped'} failed: {outs[0][-500:]}")
    rate_ex = ModelDir(model_dir).state().examples_per_sec_steady
    say(f"bench cluster: Horovod 2 hosts, link {rate or 'unshaped'} ({goodput * 8 / 1e6:,.0f} Mbit/s): "
        f"{rate_ex:,.0f} ex/s")
    return 2 * batch / rate_ex, goodput


def overheads_from(measured: dict, link: dict, compute_s: float) -> Overheads:
    """Per-step time that is neither the advisor's compute probe nor bytes over bandwidth, from the
    unshaped runs: step - compute - link bytes / goodput."""
    base = measured["unshaped"]
    over = {s: base[s]["step_s"] - compute_s - link[s] / base[s]["goodput"] for s in ("ps", "horovod")}
    return Overheads(allreduce_s=over["horovod"], ps_s=over["ps"])


def _compute_probe(data: str, cfg: str, work: str) -> float:
    """The advisor's measured local step (what `recpipe advise` uses as compute)."""
    out = os.path.join(work, "advice.json")
    subprocess.run([*CLI, "advise", "--data", data, "--config", cfg, "--np", "2", "--ps-servers", "2", "--output", out],
                   check=True, capture_output=True, timeout=900)
    return fsio.read_json(out)["step_compute_s"]


def bench_cluster(o: ClusterBenchOptions, work: str, cfg_path: str, say: Callable[[str], None]) -> dict:
    usable, why = netns_available()
    if not usable:
        raise RecpipeError(f"bench cluster: needs network namespaces ({why})")
    os.makedirs(work, exist_ok=True)
    with open(cfg_path) as fh:
        base = yaml.safe_load(fh)
    base["train"]["checkpoint_every"] = max(o.steps // 2, 1)  # the steady rate is the second interval
    cfg = os.path.join(work, "cluster.yaml")
    with open(cfg, "w") as fh:
        yaml.safe_dump(base, fh)
    data = preprocess_once(cfg, generate_once(o.rows, os.path.join(work, "log")), os.path.join(work, "pre"))
    parsed = load_config(cfg)
    t = traffic_inputs(data, parsed)
    batch, mode = t.batch_size, parsed.train.sparse_gradients
    allreduce_bytes, ps_bytes = link_bytes(t, 2, 2, mode)
    link = {"ps": ps_bytes, "horovod": allreduce_bytes}
    compute_s = _compute_probe(data, cfg, work)
    names = [r or "unshaped" for r in o.rates]
    got: dict = {n: {"ps": [], "horovod": []} for n in names}
    for rep in range(o.reps):
        for rate, name in zip(o.rates, names):
            for strategy, fn in (("ps", _ps_step_s), ("horovod", _horovod_step_s)):
                got[name][strategy].append(fn(rate, data, cfg, o.steps, batch, work, say))
        say(f"bench cluster: repetition {rep + 1}/{o.reps} done")
    measured = {n: {s: {"step_s": summary([v[0] for v in got[n][s]])["median"],
                        "goodput": summary([v[1] for v in got[n][s]])["median"],
                        "step_s_reps": summary([v[0] for v in got[n][s]])} for s in ("ps", "horovod")}
                for n in names}
    over = overheads_from(measured, link, compute_s)
    predictions, ratios = {}, {}
    for name in names[1:]:
        for s, pick in (("horovod", 0), ("ps", 1)):
            m = measured[name][s]
            advise = step_times(compute_s, t, 2, 2, m["goodput"], sparse_gradients=mode)[pick]
            calibrated = step_times(compute_s, t, 2, 2, m["goodput"], over, mode)[pick]
            predictions[f"{s}_{name}"] = {"measured_step_s": m["step_s"], "bytes_only_s": link[s] / m["goodput"],
                                          "advise_uncalibrated_s": advise, "calibrated_s": calibrated,
                                          "advise_uncalibrated_error": abs(advise - m["step_s"]) / m["step_s"],
                                          "calibrated_error": abs(calibrated - m["step_s"]) / m["step_s"]}
            ratios[f"cluster_{s}_prediction_error_{name}"] = predictions[f"{s}_{name}"]["calibrated_error"]
    return {"suite": "cluster", "quick": o.quick, "rows": o.rows, "steps": o.steps, "reps": o.reps,
            "traffic": {**asdict(t), "sparse_gradients": mode, "horovod_bytes": t.horovod_bytes(2, mode)},
            "link_bytes_per_step": link, "measured": measured,
            "calibration": {"overheads": {"allreduce_s": over.allreduce_s, "ps_s": over.ps_s},
                            "compute_probe_s": compute_s,
                            "note": "per-step seconds beyond the advisor's local compute probe and bytes over "
                                    "bandwidth, measured on the unshaped link"},
            "predictions": predictions, "ratios": ratios}


def _horovod_split(x: dict) -> str:
    """What a Horovod link carries, from the suite's traffic record (older records: every row allgathered)."""
    if "horovod_bytes" not in x:
        return (f"ring allreduce of {x['dense_params']:,} dense parameters + allgather of "
                f"{x['row_bytes_unique'] / 2**20:.2f} MB of embedding rows")
    reduced, gathered = x["horovod_bytes"]
    return (f"ring allreduce of {reduced / 2**20:.2f} MB: the dense gradients and the embedding tables "
            f"`sparse_gradients: {x['sparse_gradients']}` sends whole; allgather of {gathered / 2**20:.2f} MB "
            f"of the other tables' rows")


def markdown(r: dict) -> str:
    rows = []
    for name, p in r["predictions"].items():
        strategy, link = name.split("_", 1)
        rows.append(f"| {strategy} | {link} | {p['measured_step_s'] * 1000:,.0f} | {p['bytes_only_s'] * 1000:,.0f} | "
                    f"{p['advise_uncalibrated_s'] * 1000:,.0f} ({p['advise_uncalibrated_error']:.0%}) | "
                    f"{p['calibrated_s'] * 1000:,.0f} ({p['calibrated_error']:.0%}) |")
    m, o = r["measured"], r["calibration"]["overheads"]
    lines = [f"# Cluster benchmark (network namespaces; median of {r['reps']} runs, {r['steps']} steps"
             f"{', QUICK' if r['quick'] else ''})", "",
             f"Per step and worker: {r['link_bytes_per_step']['horovod'] / 2**20:.2f} MB on each Horovod link "
             f"({_horovod_split(r['traffic'])}), "
             f"{r['link_bytes_per_step']['ps'] / 2**20:.2f} MB each way on a PS link.", "",
             "| link | goodput Mbit/s | PS step ms | Horovod step ms |", "|---|---|---|---|",
             *[f"| {n} | {v['ps']['goodput'] * 8 / 1e6:,.0f} | {v['ps']['step_s'] * 1000:,.0f} | "
               f"{v['horovod']['step_s'] * 1000:,.0f} |" for n, v in m.items()], "",
             f"Calibration (unshaped link): the advisor's local compute probe is "
             f"{r['calibration']['compute_probe_s'] * 1000:,.0f} ms per step; the time beyond it and bytes/bandwidth "
             f"is PS {o['ps_s'] * 1000:,.0f} ms, allreduce {o['allreduce_s'] * 1000:,.0f} ms (the CPU of "
             f"communication, round trips, five or two processes sharing this box's cores).", "",
             "| strategy | link | measured ms | bytes / goodput ms | advise, uncalibrated ms (error) | "
             "advise --calibration ms (error) |", "|---|---|---|---|---|---|",
             *rows, "", "Reproduce: `.venv/bin/recpipe bench cluster` (root: it creates network namespaces).", ""]
    return "\n".join(lines)
