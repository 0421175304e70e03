"""mkdocs hooks: pages generated at build time from their one source, so no page is typed by hand twice.

- cli.md from recpipe's argument parser (recpipe.cli_parser.cli_reference);
- results/*.md and their plots from bench/results/, what `recpipe bench` wrote;
- tables inside hand-written pages, where a page holds `<!-- table: NAME [ARG] -->` (see TABLES).
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- table: ([a-z-]+)(?: ([a-z]+))? -->$", re.M)


def _table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def dead_letter_reasons(_arg=None) -> str:
    from recpipe.features.canonical import DEAD_LETTER_REASONS
    return _table(("reason", "the row's field ..."), ((f"`{k}`", v) for k, v in DEAD_LETTER_REASONS.items()))


def http_limits(_arg=None) -> str:
    from recpipe.serving.server import limits as L
    return _table(("limit", "answer"), [
        (f"a body over {L.MAX_BODY_BYTES // 2 ** 20} MiB, declared or arriving chunked",
         "413, then the connection is closed (the body is never read)"),
        ("a POST with neither Content-Length nor a chunked body", "411, then closed"),
        (f"a request line and headers over {L.MAX_HEAD_BYTES // 1024} KiB", "431, then closed"),
        ("malformed HTTP", "400, then closed"),
        (f"more than {L.MAX_CONNECTIONS:,} open connections", "503 to the next, then closed"),
        (f"a request still incomplete {L.REQUEST_DEADLINE_S:g} s after its first byte (slow-loris)",
         "the connection is dropped"),
        ("an idle keep-alive connection", f"closed after {L.IDLE_TIMEOUT_S:g} s"),
        ("bad JSON, JSON nested too deep, numbers too large, bad base64", "400"),
        ("a bug in the server", "500, logged"),
    ])


def targets(suite: str) -> str:
    from recpipe.bench.targets import MEANINGS, RETIRED, TARGETS, suite_of
    rows = [(f"`{k}`", f"{op} {value:g}", MEANINGS[k]) for k, (op, value) in TARGETS.items()
            if suite_of(k) == suite]
    rows += [(f"`{k}`", "none: reported", f"{MEANINGS[k]}. No target: {why}") for k, why in RETIRED.items()
             if suite_of(k) == suite]
    if not rows:
        raise ValueError(f"no targets for the suite {suite!r}")
    return _table(("ratio", "target", "what it compares"), rows)


TABLES = {"dead-letter-reasons": dead_letter_reasons, "http-limits": http_limits, "targets": targets}


def render_tables(markdown: str) -> str:
    """The page with each `<!-- table: NAME [ARG] -->` line replaced by its generated table.

    Raises:
        KeyError: a marker names no table of TABLES.
    """
    return MARKER.sub(lambda m: TABLES[m.group(1)](m.group(2)), markdown)


def on_files(files, config):
    from recpipe.cli_parser import cli_reference
    files.append(File.generated(config, "cli.md", content=cli_reference()))
    for path in sorted((REPO / "bench" / "results").iterdir()):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    return render_tables(markdown)
