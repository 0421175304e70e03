"""Virtualenvs beside the project's for the benchmarks' peers, created from pinned requirements once and reused
(the project's own stack never changes).

They live in $RECPIPE_PEER_CACHE, else in the data cache's `peer-envs` folder, one folder per install plan and
Python version: a change of pins makes a new one. A plan is a list of pip installs run in order, each with its
own pip flags, so a package whose metadata names a dependency the plan replaces (torchrec names the CUDA
`fbgemm-gpu`; the CPU build is `fbgemm-gpu-cpu`) is installed with --no-deps after what it needs.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

from recpipe.pipeline.wheel_data import default_cache

__all__ = ["InstallStep", "plan_key", "env_cache", "ensure_env", "env_record", "run_checked"]

InstallStep = tuple[tuple[str, ...], tuple[str, ...]]  # (requirements, extra pip flags)
_MARKER = "recpipe-peer-env.json"  # written last: a folder without it is an interrupted creation


def plan_key(plan: Sequence[InstallStep], python: Optional[tuple[int, int]] = None) -> str:
    """The name of the environment folder for an install plan.

    Args:
        plan: the pip installs, in order: (requirements, extra pip flags) each.
        python: (major, minor) of the interpreter the venv is made from (default: this one's).

    Returns:
        "py311-<12 hex digits>": the Python version and a digest of the plan.
    """
    major, minor = python or sys.version_info[:2]
    text = json.dumps([[sorted(r.strip() for r in reqs), list(flags)] for reqs, flags in plan])
    return f"py{major}{minor}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def env_cache() -> str:
    """The folder holding the peer environments: $RECPIPE_PEER_CACHE, else the data cache's `peer-envs`.

    Returns:
        An absolute path (not created here).
    """
    return os.path.abspath(os.environ.get("RECPIPE_PEER_CACHE") or os.path.join(default_cache(), "peer-envs"))


def env_record(python: str) -> dict:
    """What the creation of an environment recorded: its plan, `pip freeze`, seconds and megabytes.

    Args:
        python: the environment's python executable (as ensure_env returns it).

    Returns:
        The record (empty when the environment has none).
    """
    path = os.path.join(os.path.dirname(os.path.dirname(python)), _MARKER)
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        return json.load(fh)


def ensure_env(plan: Sequence[InstallStep], cache: Optional[str] = None,
               say: Optional[Callable[[str], None]] = None) -> str:
    """The Python of the environment for `plan`, created when missing (`python -m venv`, then each pip
    install of the plan with --only-binary :all:). Processes asking at once wait for one creation (a file
    lock); an interrupted creation is removed and started again.

    Args:
        plan: the pip installs, in order: (requirements, extra pip flags) each; exact pins keep it reproducible.
        cache: the folder of environments (default: env_cache()).
        say: progress messages.

    Returns:
        The path of the environment's python executable.

    Raises:
        RuntimeError: venv or pip failed (pip's last lines in the message).
    """
    folder = os.path.join(cache or env_cache(), plan_key(plan))
    python = os.path.join(folder, "bin", "python")
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(folder, _MARKER)):
            return python
        shutil.rmtree(folder, ignore_errors=True)
        if say:
            say(f"peer environment: creating {folder}")
        t0 = time.perf_counter()
        run_checked([sys.executable, "-m", "venv", folder], "python -m venv")
        for reqs, flags in plan:
            run_checked([python, "-m", "pip", "install", "--no-input", "--only-binary", ":all:", "-q", *flags, *reqs],
                 f"pip install {' '.join(reqs)}")
        frozen = run_checked([python, "-m", "pip", "freeze"], "pip freeze").split()
        seconds = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files
                   if not os.path.islink(os.path.join(d, f)))
        with open(os.path.join(folder, _MARKER), "w") as fh:
            json.dump({"plan": [[list(r), list(f)] for r, f in plan], "installed": frozen,
                       "created_s": round(seconds, 1), "size_mb": round(size / 2**20)}, fh, indent=1)
        if say:
            say(f"peer environment: ready in {seconds:.0f} s, {size / 2**30:.1f} GB")
    return python


def run_checked(cmd: list[str], what: str, env: Optional[dict] = None) -> str:
    """Run a command; its stdout.

    Args:
        cmd: the command.
        what: what it does, for the error.
        env: its environment (default: this process's).

    Returns:
        Its stdout.

    Raises:
        RuntimeError: it failed; its last 15 lines of stderr (else stdout) in the message.
    """
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed ({done.returncode}): {tail}")
    return done.stdout
