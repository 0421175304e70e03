"""What code a process runs: for checking that the processes of one distributed job (Dask workers,
Horovod ranks on other hosts) run the same. Each imports its own install's copy of our packages, so
one with another version turns rows into other IDs, or trains another model, without a word."""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from typing import Sequence

__all__ = ["code_identity", "identity_differences"]


def code_identity(packages: Sequence[str], distributions: Sequence[str]) -> dict[str, str]:
    """A sha256 of each package's .py files (paths relative to it, and bytes), found as an import
    would find it but not imported, and the installed version of each distribution."""
    out = {}
    for package in packages:
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        if not roots:
            out[package] = "not installed"
            continue
        digest = hashlib.sha256()
        for folder, _, files in sorted(os.walk(roots[0])):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, roots[0]).encode() + b"\0")
                with open(path, "rb") as fh:
                    digest.update(fh.read() + b"\0")
        out[package] = digest.hexdigest()[:16]
    for dist in distributions:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def identity_differences(ours: dict[str, str], theirs: dict[str, str], ours_are: str = "here ") -> list[str]:
    """'KEY THEIRS (here OURS)' for each package or distribution whose identity differs ("here " is
    `ours_are`: "rank 0: " reads '(rank 0: OURS)')."""
    return [f"{k} {theirs.get(k, 'unknown')} ({ours_are}{v})" for k, v in ours.items() if theirs.get(k) != v]
