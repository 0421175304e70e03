"""Each PS task's memory against its share of the state: `recpipe train --strategy ps` on a local cluster (N PS
tasks, one worker), its PS task processes polled for their resident set. Per task: its base (its RSS when the
chief says the cluster is up, before any variable is placed on it), its peak RSS (VmHWM) and the MB of variables
and optimizer slots it holds (the chief's `train: PS task state MB:` line, recpipe.trainers.strategies.ps_placement).
Ratio key: train_ps_task_rss_vs_bound, the largest over the tasks of peak / (1.3 x state + base)
(recpipe.bench.memory_bound)."""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Callable, Optional

from recpipe.bench.common import CLI
from recpipe.bench.memory_bound import ps_tasks_vs_bound
from recpipe.trainers.strategies.ps_placement import parse_state_line

__all__ = ["CLUSTER_UP", "ps_task_of", "descendants", "bench_ps_memory", "markdown"]

CLUSTER_UP = "train: local PS cluster up"  # what LocalPSCluster says once every task listens, before the model
_TASK_MODULE = "recpipe.trainers.strategies.ps"


def ps_task_of(cmdline: list[str]) -> Optional[str]:
    """The PS task a process's command line runs ("ps:1"), or None (a worker, or another process).

    Args:
        cmdline: the process's argv (`python -m recpipe.trainers.strategies.ps CLUSTER_JSON ps 1`).

    Returns:
        "ps:INDEX" or None.
    """
    if _TASK_MODULE not in cmdline:
        return None
    rest = cmdline[cmdline.index(_TASK_MODULE) + 1:]
    return f"ps:{rest[2]}" if len(rest) >= 3 and rest[1] == "ps" else None


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """Every process below `root`.

    Args:
        root: a pid.
        parents: {pid: parent pid} of the host's processes.

    Returns:
        The pids whose chain of parents reaches `root` (root itself not included).
    """
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    out[int(name)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def _status_mb(pid: int) -> Optional[tuple[float, float]]:
    """(VmRSS, VmHWM) of a process in MB, or None once it is gone."""
    got = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    got[key] = int(value.split()[0]) / 1024.0
    except OSError:
        return None
    return (got["VmRSS"], got["VmHWM"]) if len(got) == 2 else None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def bench_ps_memory(data: str, cfg_path: str, steps: int, work: str, say: Callable[[str], None],
                    ps_tasks: int = 2, poll_s: float = 0.1) -> dict:
    """Train on a local PS cluster (`ps_tasks` PS tasks, one worker) and measure each PS task's memory.

    Args:
        data: the preprocessed data.
        cfg_path: the config.
        steps: training steps.
        work: a work folder (the model dir goes there, afresh).
        say: progress messages.
        ps_tasks: PS tasks of the cluster.
        poll_s: seconds between two polls of the tasks' memory.

    Returns:
        {"tasks": {task: {"base_rss_mb", "peak_rss_mb", "state_mb", "rss_vs_bound"}}, "wall_s", "steps",
        "ps_tasks", "ratios": {"train_ps_task_rss_vs_bound": max over tasks}}.

    Raises:
        RuntimeError: the run failed, or did not say its tasks' state, or no PS task was seen.
    """
    model_dir = os.path.join(work, "ps_memory_model")
    shutil.rmtree(model_dir, ignore_errors=True)
    cmd = [*CLI, "train", "--data", data, "--model-dir", model_dir, "--config", cfg_path, "--steps", str(steps),
           "--strategy", "ps", "--ps-workers", "1", "--ps-servers", str(ps_tasks)]
    say(f"bench ps memory: {' '.join(cmd[3:])}")
    lines: list[tuple[float, str]] = []
    samples: dict[str, list[tuple[float, float, float]]] = {}  # task -> (time, rss, hwm)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.perf_counter(), line.rstrip("\n")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pids: dict[int, str] = {}
    while proc.poll() is None:
        for pid in descendants(proc.pid, _parents()) - set(pids):
            task = ps_task_of(_cmdline(pid))
            if task is not None:
                pids[pid] = task
        for pid, task in pids.items():
            mb = _status_mb(pid)
            if mb is not None:
                samples.setdefault(task, []).append((time.perf_counter(), *mb))
        time.sleep(poll_s)
    reader.join(timeout=10)
    wall = time.perf_counter() - t0
    text = "\n".join(line for _, line in lines)
    if proc.returncode != 0:
        raise RuntimeError(f"bench ps memory: {' '.join(cmd[3:8])}... failed: {text.splitlines()[-3:]}")
    state = parse_state_line(text)
    up = next((t for t, line in lines if line.startswith(CLUSTER_UP)), None)
    if state is None or up is None or not samples:
        raise RuntimeError(f"bench ps memory: no task state line, cluster-up line or PS task seen in: "
                           f"{text.splitlines()[-5:]}")
    tasks = {}
    for task, got in sorted(samples.items()):
        before = [rss for t, rss, _ in got if t <= up]
        tasks[task] = {"base_rss_mb": before[-1] if before else got[0][1], "peak_rss_mb": max(h for _, _, h in got),
                       "state_mb": state.get(task, 0.0)}
    found = ps_tasks_vs_bound(tasks)
    for task, ratio in found.items():
        tasks[task]["rss_vs_bound"] = ratio
    say("bench ps memory: " + "; ".join(f"{t} peak {d['peak_rss_mb']:,.0f} MB, state {d['state_mb']:,.0f} MB, "
                                        f"base {d['base_rss_mb']:,.0f} MB" for t, d in tasks.items()))
    return {"tasks": tasks, "wall_s": wall, "steps": steps, "ps_tasks": ps_tasks,
            "ratios": {"train_ps_task_rss_vs_bound": max(found.values())}}


def markdown(r: dict) -> str:
    """The PS tasks' table.

    Args:
        r: bench_ps_memory's result.

    Returns:
        Markdown.
    """
    lines = [f"## PS tasks' memory (`recpipe train --strategy ps`, {r['ps_tasks']} PS tasks, 1 worker, "
             f"{r['steps']} steps)", "",
             "Base: the task's RSS when the cluster is up, before any variable is placed on it. State: the variables "
             "and Adagrad accumulators the chief placed on it. Bound: 1.3 × state + base.", "",
             "| task | base RSS MB | state MB | peak RSS MB | bound MB | peak / bound |", "|---|---|---|---|---|---|"]
    for task, d in r["tasks"].items():
        bound = 1.3 * d["state_mb"] + d["base_rss_mb"]
        lines.append(f"| {task} | {d['base_rss_mb']:,.0f} | {d['state_mb']:,.0f} | {d['peak_rss_mb']:,.0f} | "
                     f"{bound:,.0f} | {d['rss_vs_bound']:.3f} |")
    lines += [""]
    return "\n".join(lines)
