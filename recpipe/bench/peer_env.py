"""The environment the quality bench's peers run in: a virtualenv beside the project's, with LightGBM and
implicit pinned, created once and reused (recpipe.bench.isolated_env; the project's own stack does not change).

The peers are standalone scripts (recpipe.bench.peers) that import only numpy, scipy, LightGBM and implicit;
they read and write .npz/.json files in the bench's work dir.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

from recpipe.bench.isolated_env import ensure_env, run_checked

__all__ = ["PEER_REQUIREMENTS", "PEER_PLAN", "ensure_peer_env", "run_peer"]

# numpy and scipy at the project's own versions: the peers' arrays are read back by the same libraries
PEER_REQUIREMENTS = ("lightgbm==4.7.0", "implicit==0.7.3", "numpy==2.4.6", "scipy==1.17.1")
PEER_PLAN = ((PEER_REQUIREMENTS, ()),)
_PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")


def ensure_peer_env(cache: Optional[str] = None, say: Optional[Callable[[str], None]] = None) -> str:
    """The Python of the peers' environment, created when missing (isolated_env.ensure_env of PEER_PLAN).

    Args:
        cache: the folder of environments (default: isolated_env.env_cache()).
        say: progress messages.

    Returns:
        The path of the environment's python executable.

    Raises:
        RuntimeError: venv or pip failed.
    """
    return ensure_env(PEER_PLAN, cache, say)


def run_peer(script: str, request: str, cache: Optional[str] = None,
             say: Optional[Callable[[str], None]] = None) -> None:
    """Run a peer script (recpipe/bench/peers/SCRIPT.py) in the peer environment on one request file.

    The script runs isolated (`python -I`: no PYTHONPATH, no user site, not even its own folder on the path),
    so it can only import what the environment has; BLAS and OpenMP pools are held to the threads the
    request names (the suite runs two jobs at once on 2 cores).

    Args:
        script: the script's name without `.py`, e.g. "lightgbm_fit".
        request: path of the JSON request the script reads (it names its input and output files).
        cache: the folder of environments (default: isolated_env.env_cache()).
        say: progress messages.

    Raises:
        FileNotFoundError: no such peer script.
        RuntimeError: the script failed (its last lines of stderr in the message).
    """
    path = os.path.join(_PEERS, f"{script}.py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no peer script {path}")
    python = ensure_peer_env(cache, say)
    with open(request) as fh:
        threads = str(json.load(fh).get("threads", 1))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    run_checked([python, "-I", path, request], f"peer {script}", env)
