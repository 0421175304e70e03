"""mkdocs hooks: pages generated at build time from their one source, so no page is typed by hand twice.

- cli.md from recpipe's argument parser (recpipe.cli_parser.cli_reference);
- results/*.md and their plots from bench/results/, what `recpipe bench` wrote.
"""
from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent


def on_files(files, config):
    from recpipe.cli_parser import cli_reference
    files.append(File.generated(config, "cli.md", content=cli_reference()))
    for path in sorted((REPO / "bench" / "results").iterdir()):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
