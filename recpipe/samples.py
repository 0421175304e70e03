"""Where the shipped configs and the shared real Criteo sample are."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["repo_configs", "find_criteo_sample"]


def repo_configs() -> Path:
    path = Path(__file__).resolve().parents[1] / "configs"
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: shipped configs not found (install the project with `pip install -e .`)")
    return path


def find_criteo_sample() -> Optional[Path]:
    """The real Criteo sample in ../shared/data, looked up from the repo and the working directory
    (RECPIPE_CRITEO_CSV overrides)."""
    env = os.environ.get("RECPIPE_CRITEO_CSV")
    if env:
        return Path(env) if Path(env).is_file() else None
    for base in (Path(__file__).resolve().parents[1], Path.cwd()):
        candidate = base.parent / "shared" / "data" / "criteo_sample" / "criteo_10k.csv"
        if candidate.is_file():
            return candidate
    return None
