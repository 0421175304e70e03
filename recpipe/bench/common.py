"""What every benchmark suite shares: repetition summaries, measured child runs, machine info,
result files, and the generated/preprocessed datasets they reuse."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from recpipe.common import fsio
from recpipe.features.config import load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.pipeline.synthetic import GenerateSpec, generate_log
from recpipe.bench.baseline import baseline_preprocess

__all__ = ["CLI", "summary", "run_measured", "evaluate_model", "git_commit", "machine_info", "save_result",
           "generate_once", "preprocess_once"]

CLI = [sys.executable, "-m", "recpipe.cli"]


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "values": values}


def run_measured(cmd: list[str]) -> tuple[float, float, str]:
    """Run a command; return (wall seconds, peak RSS MB of that command, stdout). The command is
    started by the small `recpipe.bench.measure` process, so its peak RSS is its own and not this
    (possibly big) process's, which fork + exec would carry over. Output is spooled to temp files,
    so a chatty child cannot fill a pipe and block."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r", suffix=".json") as usage:
        proc = subprocess.run([sys.executable, "-m", "recpipe.bench.measure", usage.name, *cmd], stdout=out,
                              stderr=err, text=True)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:6])}... failed: {stderr.strip().splitlines()[-3:]}")
        peak = fsio.read_json(usage.name)["peak_rss_mb"]
    return wall, peak, stdout


# A suite's threads share this process's TensorFlow, Keras and matplotlib state: building tf.data pipelines or
# models in two threads at once can fail inside Keras (a KeyError '__class__' seen reading the peers' data
# beside an evaluation), so whatever does holds this lock.
TF_IN_PROCESS = threading.Lock()


def evaluate_model(model_dir: str, data: str) -> dict:
    """The metrics `recpipe evaluate --model-dir MODEL_DIR --data DATA` prints (recpipe.trainers.evaluation.evaluate), computed in
    this process: the same numbers without a TensorFlow start-up per model. One evaluation at a time: the
    threads of a suite share this process's Keras and matplotlib state."""
    from recpipe.trainers.evaluation.evaluate import evaluate
    with TF_IN_PROCESS:
        return evaluate(model_dir, data)


def git_commit() -> dict:
    """The commit of the code being measured and whether the tree had changes (None outside a clone)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


# The instruction sets that decide matmul speed and whether bf16 is faster than fp32 (AMX or AVX512-BF16;
# on an AVX2-only CPU oneDNN converts bf16 and gains nothing): the same box can land on different hosts.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def machine_info() -> dict:
    import importlib.metadata as md
    cpu, flags = "", set()
    try:
        with open("/proc/cpuinfo") as fh:
            lines = fh.read().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
        flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    except OSError:
        pass
    versions = {}
    for pkg in ("tensorflow", "tf-keras", "tensorflow-recommenders", "apache-beam", "horovod", "pyarrow", "numpy"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "cpu": cpu, "cpu_features": [f for f in CPU_FEATURES if f in flags],
            "memory_gib": round(mem, 1), "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            **git_commit()}


def save_result(out_dir: str, name: str, result: dict, md: str) -> None:
    """<name>.json and <name>.md, each replaced whole (another run's report may be reading the folder). A NaN
    or infinite figure (a slope over equal points, a recall over no rows) is written as null: bare NaN is
    not JSON, and jq or any parser outside Python refused the whole file. The report shows a null ratio as
    a missed target."""
    os.makedirs(out_dir, exist_ok=True)
    fsio.write_json(os.path.join(out_dir, f"{name}.json"), result)
    fsio.replace_bytes(os.path.join(out_dir, f"{name}.md"), md.encode("utf-8"))


GENERATED_SPEC = "_generate_spec.json"  # in a generated log's folder; a leading _ hides it from preprocess


def generate_once(rows: int, out: str, seed: int = 7, days: int = 2, **spec) -> str:
    """A generated log in `out` (GenerateSpec(rows, days, seed, **spec)), reused only when the one there was
    written from the same spec: a workdir's log of another size or older code is written anew (the quick
    run's 3,000 rows a day, reused by a full run in the same workdir, once stood in for its 100,000)."""
    wanted = GenerateSpec(rows=rows, days=days, seed=seed, **spec)
    want = _as_json(wanted)
    marker = os.path.join(out, GENERATED_SPEC)
    if not (os.path.exists(marker) and fsio.read_json(marker) == want):
        shutil.rmtree(out, ignore_errors=True)
        generate_log(wanted, out)
        fsio.write_json(marker, want)
    return out


def preprocess_once(cfg_path: str, log: str, out: str, beam: bool = True) -> str:
    """`recpipe preprocess` (Beam) into `out` unless it holds a complete run of the same config over the same
    generated log (`out`.source.json says which); with beam=False the single-process baseline (same functions,
    same artifact and shards, no runner start-up: for the quick run's small side datasets)."""
    with open(cfg_path) as fh:
        source = {"config": fh.read(), "log": os.path.abspath(log), "log_spec": _read_spec(log)}
    record = f"{out.rstrip(os.sep)}.source.json"
    if PreprocessedData(out).is_complete() and os.path.exists(record) and fsio.read_json(record) == source:
        return out
    shutil.rmtree(out, ignore_errors=True)
    if beam:
        subprocess.run([*CLI, "preprocess", "--config", cfg_path, "--input", log, "--output", out], check=True,
                       capture_output=True)
    else:
        baseline_preprocess(load_config(cfg_path), log, out)
    fsio.write_json(record, source)
    return out


def _as_json(spec: GenerateSpec) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(spec), default=str))


def _read_spec(log: str):
    """The spec a generated log was written from (None for any other log, e.g. the Criteo sample)."""
    path = os.path.join(log, GENERATED_SPEC)
    return fsio.read_json(path) if os.path.isdir(log) and os.path.exists(path) else None
