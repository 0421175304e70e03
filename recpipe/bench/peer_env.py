"""The environment the quality bench's peers run in: a virtualenv beside the project's, with LightGBM and
implicit pinned, created once and reused (the project's own stack does not change).

It lives in $RECPIPE_PEER_CACHE, else in the data cache's `peer-envs` folder ($RECPIPE_DATA_CACHE/peer-envs,
else ~/.cache/recpipe/peer-envs), one folder per requirement list and Python version: a change of pins makes
a new one. The peers are standalone scripts (recpipe.bench.peers) that import only numpy, scipy, LightGBM and
implicit; they read and write .npz/.json files in the bench's work dir.
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

__all__ = ["PEER_REQUIREMENTS", "requirements_key", "peer_cache", "ensure_peer_env", "run_peer"]

# numpy and scipy at the project's own versions: the peers' arrays are read back by the same libraries
PEER_REQUIREMENTS = ("lightgbm==4.7.0", "implicit==0.7.3", "numpy==2.4.6", "scipy==1.17.1")
_MARKER = "recpipe-peer-env.json"  # written last: a folder without it is an interrupted creation
_PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")


def requirements_key(requirements: Sequence[str], python: Optional[tuple[int, int]] = None) -> str:
    """The name of the environment folder for a requirement list.

    Args:
        requirements: pip requirement strings; their order does not matter.
        python: (major, minor) of the interpreter the venv is made from (default: this one's).

    Returns:
        "py311-<12 hex digits>": the Python version and a digest of the sorted requirements.
    """
    major, minor = python or sys.version_info[:2]
    digest = hashlib.sha256("\n".join(sorted(r.strip() for r in requirements)).encode()).hexdigest()[:12]
    return f"py{major}{minor}-{digest}"


def peer_cache() -> str:
    """The folder holding the peer environments: $RECPIPE_PEER_CACHE, else the data cache's `peer-envs`.

    Returns:
        An absolute path (not created here).
    """
    return os.path.abspath(os.environ.get("RECPIPE_PEER_CACHE") or os.path.join(default_cache(), "peer-envs"))


def ensure_peer_env(requirements: Sequence[str] = PEER_REQUIREMENTS, cache: Optional[str] = None,
                    say: Optional[Callable[[str], None]] = None) -> str:
    """The Python of the peer environment for `requirements`, created when missing (`python -m venv`, then
    `pip install --only-binary :all:` of the pinned requirements). Processes and threads asking at once wait
    for one creation (a file lock); an interrupted creation is removed and started again.

    Args:
        requirements: pip requirement strings (exact pins keep the environment reproducible).
        cache: the folder of environments (default: peer_cache()).
        say: progress messages.

    Returns:
        The path of the environment's python executable.

    Raises:
        RuntimeError: venv or pip failed (pip's last lines in the message).
    """
    folder = os.path.join(cache or peer_cache(), requirements_key(requirements))
    python = os.path.join(folder, "bin", "python")
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(folder, _MARKER)):
            return python
        shutil.rmtree(folder, ignore_errors=True)
        if say:
            say(f"peer environment: creating {folder} ({' '.join(requirements)})")
        t0 = time.perf_counter()
        _run([sys.executable, "-m", "venv", folder], "python -m venv")
        _run([python, "-m", "pip", "install", "--no-input", "--only-binary", ":all:", "-q", *requirements],
             "pip install")
        frozen = _run([python, "-m", "pip", "freeze"], "pip freeze").split()
        with open(os.path.join(folder, _MARKER), "w") as fh:
            json.dump({"requirements": list(requirements), "installed": frozen,
                       "created_s": round(time.perf_counter() - t0, 1)}, fh, indent=1)
        if say:
            say(f"peer environment: ready in {time.perf_counter() - t0:.0f} s")
    return python


def run_peer(script: str, request: str, requirements: Sequence[str] = PEER_REQUIREMENTS,
             cache: Optional[str] = None, say: Optional[Callable[[str], None]] = None) -> None:
    """Run a peer script (recpipe/bench/peers/SCRIPT.py) in the peer environment on one request file.

    The script runs isolated (`python -I`: no PYTHONPATH, no user site, not even its own folder on the path),
    so it can only import what the environment has; BLAS and OpenMP pools are held to the threads the
    request names (the suite runs two jobs at once on 2 cores).

    Args:
        script: the script's name without `.py`, e.g. "lightgbm_fit".
        request: path of the JSON request the script reads (it names its input and output files).
        requirements: the environment's pins (ensure_peer_env).
        cache: the folder of environments (default: peer_cache()).
        say: progress messages.

    Raises:
        FileNotFoundError: no such peer script.
        RuntimeError: the script failed (its last lines of stderr in the message).
    """
    path = os.path.join(_PEERS, f"{script}.py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no peer script {path}")
    python = ensure_peer_env(requirements, cache, say)
    with open(request) as fh:
        threads = str(json.load(fh).get("threads", 1))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    _run([python, "-I", path, request], f"peer {script}", env)


def _run(cmd: list[str], what: str, env: Optional[dict] = None) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"{what} failed ({done.returncode}): {tail}")
    return done.stdout
