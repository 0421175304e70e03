"""The code's shape, checked: the import graph has no cycle (function-level imports included, so
none can hide one), packages import only downward, and the TensorFlow environment is set once."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

PACKAGES = ("features", "pipeline", "trainers", "serving", "recpipe")
# What each package may import from the project (data flows one way: features <- the rest).
ALLOWED = {
    "features": {"features"},
    "pipeline": {"features", "pipeline"},
    "trainers": {"features", "trainers"},
    "serving": {"features", "trainers", "serving"},
    "recpipe": set(PACKAGES),
    "airflow_dags": set(),
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in (*PACKAGES, "airflow_dags"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports anywhere in its body (a `from pkg import name` of a submodule
    counts as importing that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_import_graph_has_no_cycle():
    graph = _graph()
    assert len(graph) > 40  # the walk found the project
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_packages_import_only_downward():
    wrong = [f"{m} imports {d}" for m, deps in _graph().items() for d in deps
             if d.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert wrong == []


def test_tensorflow_environment_is_set_in_one_place():
    setters = [str(p.relative_to(REPO)) for p in _modules().values()
               if 'os.environ["TF_USE_LEGACY_KERAS"]' in p.read_text()]
    assert setters == ["features/tf_env.py"]
    for pkg in PACKAGES:  # every package sets it up before any of its modules can import TensorFlow
        init = (REPO / pkg / "__init__.py").read_text()
        assert "from features import tf_env" in init, pkg
    noqa = [str(p.relative_to(REPO)) for p in _modules().values() if "noqa: E402" in p.read_text()]
    assert noqa == []
