"""The documentation a newcomer reads: a short README, pages without history, and links that lead somewhere
(the site build, `make docs`, checks the site's links again with warnings as errors)."""
from __future__ import annotations

import importlib.util
import inspect
import re

import pytest

from helpers import REPO

pytestmark = pytest.mark.unit

PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
HISTORY = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b[Ii]ssue \d+\b|\bat [0-9a-f]{7,12}\b|`[0-9a-f]{7,12}`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_hold_no_history(page):
    """Dates, commit hashes and issue numbers belong in git and CHANGELOG.md (example dates in commands,
    such as `--day 2026-01-02`, excepted)."""
    found = [line for line in page.read_text().splitlines()
             if HISTORY.search(line) and "--day" not in line and "dt=" not in line and "start-date" not in line]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = [target for target in LINK.findall(text)
              if "://" not in target and not target.startswith(("#", "mailto:"))
              and not _exists(page, target.split("#")[0])]
    assert broken == []


def _exists(page, target: str) -> bool:
    """A file, or in the site a page docs/hooks.py generates: cli.md, and results/ from bench/results/."""
    if page.parent == REPO / "docs":
        if target == "cli.md":
            return True
        if target.startswith("results/"):
            return (REPO / "bench" / target).exists()
    return (page.parent / target).exists()


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
def test_generated_tables_render(page):
    """Every `<!-- table: ... -->` marker names a table the site build can generate."""
    hooks = _hooks()
    rendered = hooks.render_tables(page.read_text())
    assert "<!-- table:" not in rendered


def test_every_suite_lists_its_targets():
    from recpipe.bench.targets import MEANINGS, RETIRED, SUITES, TARGETS
    assert MEANINGS.keys() == TARGETS.keys() | RETIRED.keys() and not TARGETS.keys() & RETIRED.keys()
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert [s for s in SUITES if f"<!-- table: targets {s} -->" not in text] == []
    assert {k.split("_", 1)[0] for k in TARGETS} <= set(SUITES)


def test_dead_letter_reasons_are_listed_in_the_order_they_are_checked():
    from recpipe.features import canonical
    checked = re.findall(r'flag\(.*?,\s*"(\w+)",', inspect.getsource(canonical.validate_batch), flags=re.S)
    assert checked == list(canonical.DEAD_LETTER_REASONS)
