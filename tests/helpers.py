"""Helpers several test modules share (test modules never import each other)."""
from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from conftest import small_config_dict

REPO = Path(__file__).resolve().parent.parent


def package_folders() -> dict[str, str]:
    """setup.py's FOLDERS: each import name of the `recpipe` namespace -> the folder it installs from."""
    tree = ast.parse((REPO / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FOLDERS")
    return ast.literal_eval(node.value)


def installed_copy(dest: Path) -> Path:
    """Lay this source tree out under DEST as a wheel installs it (DEST/recpipe/features/, ...), so a process
    with DEST first on its PYTHONPATH imports that copy of recpipe instead of this one. Returns DEST/recpipe."""
    for name, folder in sorted(package_folders().items()):  # recpipe first, then its mapped subpackages
        shutil.copytree(REPO / folder, dest.joinpath(*name.split(".")),
                        ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return dest / "recpipe"


QUIET = dict(say=lambda _: None)  # keyword arguments that silence run_preprocess's and train's progress lines


def run_cli(*args, timeout=600) -> subprocess.CompletedProcess:
    """`python -m recpipe.cli ARGS...` in a process of its own, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "recpipe.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def config_file(tmp_path: Path, d: dict | None = None) -> str:
    """Write config dict D (the small config if none) to TMP_PATH/cfg.yaml; returns its path."""
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(d or small_config_dict()))
    return str(path)


def day_table(small_log: str, n: int = 400) -> pa.Table:
    """The first N rows of the small log's first Parquet file."""
    return pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]).slice(0, n)


def write_table(path: Path, table: pa.Table) -> str:
    """Write TABLE as the Parquet file PATH (making its folder); returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return str(path)


def set_column(table: pa.Table, name: str, values, type_=None) -> pa.Table:
    """TABLE with its column NAME replaced by VALUES (of Arrow type TYPE_, inferred if None)."""
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, type_))


def raw_rows(small_log: str, small_cfg, n: int = 6) -> tuple[list[dict], list[int]]:
    """The last N rows of the small log's last file as REST instances over every feature's column, and their
    labels."""
    from recpipe.localserver import rest_rows
    files = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))
    columns = sorted({f.column for f in [*small_cfg.features.sparse, *small_cfg.features.dense]})
    return rest_rows(files[-1], columns, n)
