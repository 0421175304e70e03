"""The code's shape, checked: the import graph has no cycle (function-level imports included, so
none can hide one), packages import only downward, and the TensorFlow environment is set once."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO
from helpers import package_folders

pytestmark = pytest.mark.unit

FOLDERS = package_folders()
OLD_TOP_LEVEL = ("features", "pipeline", "trainers", "serving")
SERVING_SHARED = ("recpipe.serving.version", "recpipe.serving.errors", "recpipe.serving.warmup",
                  "recpipe.serving.examples")
# What each part may import from the project, by the longest prefix that names it. Data flows one way:
# common <- features <- pipeline, trainers <- serving's export; the server loads SavedModels and imports
# nothing of training; trainers never import serving; recpipe's own modules (CLI, API, bench) sit on top.
ALLOWED = {
    "recpipe.common": ("recpipe.common",),
    "recpipe.features": ("recpipe.common", "recpipe.features"),
    "recpipe.pipeline": ("recpipe.common", "recpipe.features", "recpipe.pipeline"),
    "recpipe.trainers": ("recpipe.common", "recpipe.features", "recpipe.trainers"),
    "recpipe.serving": ("recpipe.common", "recpipe.features", *SERVING_SHARED),
    "recpipe.serving.server": ("recpipe.common", "recpipe.features", *SERVING_SHARED, "recpipe.serving.server"),
    "recpipe.serving.export": ("recpipe.common", "recpipe.features", "recpipe.trainers", "recpipe.serving"),
    "recpipe": ("recpipe",),
    "airflow_dags": (),
}


def _part(module: str) -> str:
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def _allowed(module: str, dep: str) -> bool:
    return any(dep == a or dep.startswith(a + ".") for a in ALLOWED[_part(module)])


def _modules() -> dict[str, Path]:
    out = {}
    for name, folder in (*FOLDERS.items(), ("airflow_dags", "airflow_dags")):
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = (*name.split("."), *path.relative_to(REPO / folder).with_suffix("").parts)
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
    wrong = [f"{m} imports {d}" for m, deps in _graph().items() for d in deps if not _allowed(m, d)]
    assert wrong == []


def test_the_direction_rules_refuse_what_they_name():
    assert not _allowed("recpipe.serving.server.rest", "recpipe.trainers.layers")
    assert not _allowed("recpipe.serving.server.registry", "recpipe.serving.export.prune")
    assert not _allowed("recpipe.trainers.train", "recpipe.serving.version")
    assert not _allowed("recpipe.features.transform", "recpipe.pipeline.transforms")
    assert not _allowed("recpipe.common.fsio", "recpipe.features.config")
    assert _allowed("recpipe.serving.export.savedmodel", "recpipe.trainers.model_dir")
    assert _allowed("recpipe.serving.server.registry", "recpipe.serving.warmup")


def test_nothing_imports_the_old_top_level_names():
    """Everything installs under `recpipe`: an import of `features` or `pipeline` would find another
    project's package of that name, or nothing."""
    wrong = []
    for name, path in {**_modules(), **{p.stem: p for p in (REPO / "tests").glob("*.py")}}.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            wrong += [f"{name} imports {n}" for n in names if n.split(".")[0] in OLD_TOP_LEVEL]
    assert wrong == []


def test_tensorflow_environment_is_set_in_one_place():
    setters = [str(p.relative_to(REPO)) for p in _modules().values()
               if 'os.environ["TF_USE_LEGACY_KERAS"]' in p.read_text()]
    assert setters == ["recpipe/common/tf_env.py"]
    # recpipe/__init__.py runs before any module of the namespace: its first import sets it up
    init = ast.parse((REPO / "recpipe" / "__init__.py").read_text())
    first = next(n for n in init.body if isinstance(n, (ast.Import, ast.ImportFrom)))
    assert (first.module, [a.name for a in first.names]) == ("recpipe.common", ["tf_env"])
    noqa = [str(p.relative_to(REPO)) for p in _modules().values() if "noqa: E402" in p.read_text()]
    assert noqa == []


PUBLIC_PACKAGES = ("recpipe", "recpipe.features")


def _contract_problems(name: str, obj) -> list[str]:
    """A public function states its contract in Google style: Args (when it takes any), Returns (when it
    returns something), Raises (when it raises on bad input); a class says what it holds (Args or
    Attributes), and each of its public methods has a docstring with the same sections."""
    import dataclasses
    import inspect

    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        out = [] if doc else [f"{name}: no docstring"]
        if issubclass(obj, Exception):
            return out
        if doc and "Args:" not in doc and "Attributes:" not in doc:
            out.append(f"{name}: the class docstring names no Args or Attributes")
        for attr, member in vars(obj).items():
            if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, (classmethod,
                                                                                               staticmethod))):
                continue
            out += _contract_problems(f"{name}.{attr}", getattr(obj, attr))
        if dataclasses.is_dataclass(obj):
            return out
        return out
    if not doc:
        return [f"{name}: no docstring"]
    sig = inspect.signature(obj)
    params = [p for p in sig.parameters if p not in ("self", "cls")]
    out = []
    if params and "Args:" not in doc:
        out.append(f"{name}: no Args section")
    returns = sig.return_annotation
    if returns not in (None, "None", inspect.Signature.empty) and "Returns:" not in doc:
        out.append(f"{name}: no Returns section")
    source = inspect.getsource(obj)
    if "raise " in source and "Raises:" not in doc:
        out.append(f"{name}: raises but has no Raises section")
    return out


def test_every_public_name_states_its_contract():
    import importlib
    problems = []
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        assert module.__all__, package
        for name in module.__all__:
            problems += _contract_problems(f"{package}.{name}", getattr(module, name))
    assert problems == []


def test_the_contract_check_finds_what_is_missing():
    def documented(a: int) -> int:
        """Double it.

        Args:
            a: a number.

        Returns:
            2a.

        Raises:
            ValueError: a is negative.
        """
        if a < 0:
            raise ValueError(a)
        return 2 * a

    def undocumented(a: int) -> int:
        """Double it."""
        if a < 0:
            raise ValueError(a)
        return 2 * a

    assert _contract_problems("documented", documented) == []
    assert _contract_problems("undocumented", undocumented) == [
        "undocumented: no Args section", "undocumented: no Returns section",
        "undocumented: raises but has no Raises section"]


def test_docstrings_state_what_code_does_not_its_history():
    """History (what a function used to do, which fix changed it) belongs in git and CHANGELOG.md."""
    history = re.compile(r"\bused to\b|\b[Ii]ssue \d+\b|\b[Ff]ix \d+\b")
    found = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                if history.search(doc):
                    found.append(f"{name}:{getattr(node, 'name', '')}")
    assert found == []
