"""`recpipe bench compare OLD.json NEW.json`: the ratio changes between two runs of a suite (or two
result folders), each ratio against its target, so a regression shows in one command."""
from __future__ import annotations

import json
import os

from recpipe.common import fsio
from recpipe.bench.targets import SUITES, TARGETS, meets

__all__ = ["load_ratios", "compare_ratios", "format_comparison"]


def load_ratios(path: str) -> tuple[dict[str, float], str]:
    """(ratios, git commit) of one suite JSON, or of every suite JSON in a results folder."""
    files = [os.path.join(path, f"{s}.json") for s in SUITES] if os.path.isdir(path) else [path]
    ratios: dict[str, float] = {}
    commits = set()
    for f in files:
        if not os.path.exists(f):
            continue
        result = fsio.read_json(f)
        found = result.get("ratios", {}) if isinstance(result, dict) else None
        if not isinstance(found, dict):
            raise ValueError(f"{f}: not a bench result (a JSON object whose 'ratios' is an object)")
        for key, value in found.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{f}: ratio {key!r} is {json.dumps(value)[:60]}, not a number or null")
        ratios.update(found)
        commits.add((result.get("machine") or {}).get("git_commit") or "unknown")
    if not ratios:
        raise ValueError(f"{path}: no bench ratios found (a bench/results/<suite>.json or its folder)")
    return ratios, ", ".join(sorted(c[:12] for c in commits))


def _meets(key: str, value: float | None) -> bool | None:
    return meets(key, value) if key in TARGETS else None


def compare_ratios(old: dict[str, float], new: dict[str, float]) -> list[dict]:
    """One row per ratio in either run: old, new, new/old, target, and the verdict: "regressed" when
    a target met before is missed now (a null ratio, NaN or infinite in its run, misses it), "fixed" the
    other way round, "null" for a null ratio otherwise, else "better"/"worse"/"same" by the target's
    direction (5 % or more counts)."""
    rows = []
    for key in sorted(set(old) | set(new)):
        o, n = old.get(key), new.get(key)
        change = n / o if o not in (None, 0) and n is not None else None
        before, after = _meets(key, o), _meets(key, n)
        if key not in old or key not in new:
            verdict = "new" if key not in old else "gone"
        elif before is True and after is False:
            verdict = "regressed"
        elif before is False and after is True:
            verdict = "fixed"
        elif change is None:  # a null ratio (NaN or infinite in its run), or an old value of 0
            verdict = "null" if n is None or o is None else "changed"
        else:
            up_is_good = TARGETS.get(key, (">=",))[0] == ">="
            if abs(change - 1) < 0.05:
                verdict = "same"
            else:
                verdict = "better" if (change > 1) == up_is_good else "worse"
        target = f"{TARGETS[key][0]} {TARGETS[key][1]:g}" if key in TARGETS else ""
        rows.append({"ratio": key, "old": o, "new": n, "change": change, "target": target, "verdict": verdict})
    return rows


def format_comparison(rows: list[dict], old_label: str, new_label: str) -> str:
    def num(v):
        return "-" if v is None else f"{v:.3f}"

    width = max([len(r["ratio"]) for r in rows] + [5])
    lines = [f"old: {old_label}", f"new: {new_label}",
             f"{'ratio':<{width}}  {'old':>9}  {'new':>9}  {'new/old':>8}  {'target':>8}  verdict"]
    for r in rows:
        lines.append(f"{r['ratio']:<{width}}  {num(r['old']):>9}  {num(r['new']):>9}  "
                     f"{('%.2fx' % r['change']) if r['change'] is not None else '-':>8}  {r['target']:>8}  "
                     f"{r['verdict'].upper() if r['verdict'] == 'regressed' else r['verdict']}")
    return "\n".join(lines)
