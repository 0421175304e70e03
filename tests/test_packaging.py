"""What `pip install` of this repository puts into site-packages: one import name, `recpipe`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from helpers import REPO, package_folders

PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        out[name] = module.__file__
    except ImportError as e:
        out[name] = None
print(json.dumps(out))
"""
OURS = ["recpipe", "recpipe.features", "recpipe.pipeline", "recpipe.trainers", "recpipe.serving",
        "recpipe.common", "recpipe.serving.server", "recpipe.trainers.strategies"]
OLD = ["features", "pipeline", "trainers", "serving"]


def _probe(python: str, cwd: Path, env: dict | None = None) -> dict:
    out = subprocess.run([python, "-c", PROBE, *OURS, *OLD], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.integration
def test_the_wheel_installs_one_top_level_name(tmp_path):
    """`pip wheel .`, installed into a clean venv: recpipe and its subpackages import from the venv,
    `import features` and the like fail, and the wheel names `recpipe` as its only top-level package."""
    source = tmp_path / "source"  # what a fresh clone has: no build/ folder left by an earlier build
    source.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in package_folders().values():
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("recpipe-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert zf.read(top_level).decode().split() == ["recpipe"]
    roots = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert roots == {"recpipe"}
    for name, folder in package_folders().items():  # every folder's modules are in the wheel, under recpipe/
        for path in (REPO / folder).rglob("*.py"):
            assert "/".join([*name.split("."), *path.relative_to(REPO / folder).parts]) in names, path

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as zf:  # what pip does with a pure-Python wheel, without a pip in the venv
        zf.extractall(site)
    # The dependencies (PyYAML, ...) come from this environment's site-packages, added as a plain path: its
    # .pth files, among them the editable install's finder, are not run there.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = _probe(python, tmp_path, env)
    for name in OURS:
        assert found[name] and found[name].startswith(site), (name, found[name])
    assert [name for name in OLD if found[name]] == []


@pytest.mark.integration
def test_the_editable_install_maps_the_folders_under_recpipe(tmp_path):
    """The development install (`make demo`, `pip install -e .`): outside the source tree, recpipe.features
    is this repository's features/ folder, and `features` is no module at all."""
    found = _probe(sys.executable, tmp_path, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    for name, folder in package_folders().items():
        assert found[name] == str(REPO / folder / "__init__.py"), (name, found[name])
    assert [name for name in OLD if found[name]] == []
