"""The figures of `recpipe bench scaling` (recpipe.bench.scaling): least-squares slopes on log-log axes (the
exponent of cost against size: 1 linear, 0 flat), the suite's ratio keys, its report in words and its plot."""
from __future__ import annotations

import io
import math
import os
from typing import Optional

from recpipe.common import fsio

__all__ = ["loglog_slope", "marginal_rate", "ratios", "growth_words", "explain", "markdown", "write_png", "PNG"]

PNG = "scaling.png"

# ratio key -> (section, runner or None, figure): the slope of that figure against the section's size
_SLOPES = {"scaling_preprocess_time_slope_direct": ("preprocess", "direct", "wall_s"),
           "scaling_preprocess_time_slope_dask": ("preprocess", "dask", "wall_s"),
           "scaling_preprocess_rss_slope_direct": ("preprocess", "direct", "peak_rss_mb"),
           "scaling_preprocess_rss_slope_dask": ("preprocess", "dask", "peak_rss_mb"),
           "scaling_train_time_slope": ("train", None, "wall_s"),
           "scaling_train_rss_slope": ("train", None, "peak_rss_mb")}


def loglog_slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The least-squares line through (log10 x, log10 y): y ~ 10**intercept * x**slope.

    Args:
        xs: sizes (> 0).
        ys: costs (> 0), one per size.

    Returns:
        (slope, intercept); NaN for both when fewer than 2 distinct sizes.

    Raises:
        ValueError: lengths differ, or a size or cost is not positive.
    """
    if len(xs) != len(ys):
        raise ValueError(f"loglog_slope: {len(xs)} sizes against {len(ys)} costs")
    if any(v <= 0 for v in [*xs, *ys]):
        raise ValueError("loglog_slope: sizes and costs must be positive")
    lx, ly = [math.log10(v) for v in xs], [math.log10(v) for v in ys]
    if len(set(lx)) < 2:
        return float("nan"), float("nan")
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
    return slope, my - slope * mx


def _series(result: dict, section: str, runner: Optional[str]) -> tuple[str, list[dict]]:
    """(the size's key, the points sorted by size) of a section (and runner)."""
    if section == "preprocess":
        return "rows", sorted(result["preprocess"]["points"][runner], key=lambda p: p["rows"])
    return "table_rows", sorted(result["train"]["points"], key=lambda p: p["table_rows"])


def marginal_rate(points: list[dict], size: str) -> float:
    """Size per second between the two largest points: the rate without the fixed start-up every run pays.

    Args:
        points: measured points with `size` and "wall_s".
        size: the size's key ("rows").

    Returns:
        (largest size - the next) / (its wall s - the next's); NaN with fewer than 2 points or no added time.
    """
    p = sorted(points, key=lambda q: q[size])[-2:]
    if len(p) < 2 or p[1]["wall_s"] <= p[0]["wall_s"]:
        return float("nan")
    return (p[1][size] - p[0][size]) / (p[1]["wall_s"] - p[0]["wall_s"])


def ratios(result: dict) -> dict:
    """The suite's slopes and ratio keys from its points.

    Args:
        result: bench_scaling's result (preprocess and train points).

    Returns:
        {"slopes": {key: {"slope", "intercept", "points"}}, "ratios": {key: value}}: every slope of _SLOPES,
        and scaling_train_rss_mb_per_state_mb, the peak RSS added per MB of weights and Adagrad slots added
        from the smallest table to the largest.
    """
    slopes, found = {}, {}
    for key, (section, runner, figure) in _SLOPES.items():
        size, points = _series(result, section, runner)
        slope, intercept = loglog_slope([p[size] for p in points], [p[figure] for p in points]) \
            if points else (float("nan"), float("nan"))
        slopes[key] = {"slope": slope, "intercept": intercept, "points": len(points)}
        found[key] = slope
    _, train = _series(result, "train", None)
    if len(train) >= 2:
        first, last = train[0], train[-1]
        found["scaling_train_rss_mb_per_state_mb"] = \
            (last["peak_rss_mb"] - first["peak_rss_mb"]) / (last["state_mb"] - first["state_mb"])
    return {"slopes": slopes, "ratios": found}


def growth_words(slope: float, what: str) -> str:
    """A slope in words.

    Args:
        slope: a log-log slope.
        what: "time" or "rss".

    Returns:
        e.g. "linear", "flat", "sublinear".
    """
    if math.isnan(slope):
        return "not measured"
    if what == "rss":
        return "flat" if slope < 0.1 else "nearly flat" if slope < 0.2 else "linear" if 0.9 <= slope <= 1.1 \
            else "sublinear" if slope < 0.9 else "superlinear"
    return "linear" if 0.9 <= slope <= 1.1 else "sublinear" if slope < 0.9 else "superlinear"


def _summary_words(result: dict) -> list[str]:
    """The result in sentences: time and RSS of each runner against rows, and training against table rows."""
    r = result["ratios"]
    lines = []
    for runner, name in (("direct", "the DirectRunner"), ("dask", "the Dask runner")):
        points = result["preprocess"]["points"][runner]
        if len(points) < 2:
            continue
        t, m = r[f"scaling_preprocess_time_slope_{runner}"], r[f"scaling_preprocess_rss_slope_{runner}"]
        lo, hi = points[0], points[-1]
        lines.append(
            f"- **Preprocess, {name}**: time grows as rows^{t:.2f} ({growth_words(t, 'time')}; from "
            f"{lo['rows']:,} to {hi['rows']:,} rows, {lo['wall_s']:.0f} s to {hi['wall_s']:.0f} s, "
            f"{marginal_rate(points, 'rows'):,.0f} rows/s between the two largest points once start-up is paid). "
            f"Peak RSS of the process tree grows as rows^{m:.2f} ({growth_words(m, 'rss')}: "
            f"{lo['peak_rss_mb']:,.0f} MB to {hi['peak_rss_mb']:,.0f} MB for {hi['rows'] / lo['rows']:,.0f}x "
            f"the rows).")
    points = result["train"]["points"]
    if len(points) >= 2:
        lo, hi = points[0], points[-1]
        t, m = r["scaling_train_time_slope"], r["scaling_train_rss_slope"]
        lines.append(
            f"- **Train**: at a fixed {result['train']['steps']} steps, time grows as table rows^{t:.2f} "
            f"({lo['wall_s']:.0f} s to {hi['wall_s']:.0f} s), while the steady step rate goes from "
            f"{lo['examples_per_s_steady']:,.0f} to {hi['examples_per_s_steady']:,.0f} ex/s: a step touches the "
            f"rows of its batch's IDs whatever the table size, and what grows with the tables is building and "
            f"initialising them and writing their checkpoints ({lo['model_dir_bytes'] / 2**20:,.0f} MB to "
            f"{hi['model_dir_bytes'] / 2**20:,.0f} MB of model dir). Peak RSS grows as table rows^{m:.2f}, "
            f"{lo['peak_rss_mb']:,.0f} MB to "
            f"{hi['peak_rss_mb']:,.0f} MB: a fixed base plus "
            f"{r['scaling_train_rss_mb_per_state_mb']:.2f} MB per MB of weights and Adagrad slots "
            f"({lo['state_mb']:,.0f} MB to {hi['state_mb']:,.0f} MB of state), so the slope approaches 1 "
            f"once the tables outweigh the base.")
    return lines


def explain(key: str, r: dict) -> Optional[str]:
    """Why a scaling target is where it is, from the run's own figures.

    Args:
        key: a ratio key.
        r: the suite's result.

    Returns:
        The explanation, or None for a key this suite does not explain.
    """
    if key != "scaling_preprocess_rss_slope_direct":
        return None
    points = r["preprocess"]["points"]["direct"]
    lo, hi = points[0], points[-1]
    return (f"the DirectRunner's peak RSS went from {lo['peak_rss_mb']:,.0f} MB at {lo['rows']:,} rows to "
            f"{hi['peak_rss_mb']:,.0f} MB at {hi['rows']:,} ({hi['rows'] / lo['rows']:,.0f}x the rows), all of it "
            f"in one process ({hi['largest_process_rss_mb']:,.0f} MB). The in-memory runner holds whatever crosses "
            f"a stage boundary whole, in several copies (encoded, decoded, handed to the next stage); the largest "
            f"that crosses one is the vocabularies' count tables, one row per distinct ID, and a Zipf log's distinct "
            f"IDs keep growing until each column's cardinality is reached.")


def markdown(r: dict) -> str:
    """The suite's report.

    Args:
        r: bench_scaling's result (with "machine").

    Returns:
        Markdown.
    """
    m, p, t = r["machine"], r["preprocess"], r["train"]
    quick = ", QUICK" if r["quick"] else ""
    lines = [f"# How cost grows (one run per point, {m['cpus']} cores, {m['cpu']}, {m['memory_gib']} GiB{quick})",
             "", "## In words", "", *_summary_words(r), ""]
    left = r.get("left_out", {}).get("dask")
    if left:
        lines += [f"Left out: the Dask runner at {', '.join(f'{n:,}' for n in left)} rows (the run had to fit its "
                  f"time budget on 2 shared cores; the Dask slopes are fitted on the points it has).", ""]
    lines += [f"![time and peak RSS against size, log-log, with the fitted slopes]({PNG})", "",
              f"## Preprocess (`recpipe preprocess`, Criteo-shaped log, `configs/{p['config']}`: 26 vocabularies)",
              "", "DirectRunner: the default (in_memory, one process). Dask: a local dask.distributed cluster of "
              f"{p['dask_workers']} single-threaded workers, started by the measured command. Peak RSS is the sum "
              "over every process of the command (sampled every 0.1 s); output is the shards and the transform "
              "artifact.", "",
              "| runner | rows | wall s | rows/s | CPU s | peak RSS MB (all processes) | largest process MB | "
              "input MB | output MB |", "|---|---|---|---|---|---|---|---|---|"]
    for runner in ("direct", "dask"):
        for q in p["points"][runner]:
            lines.append(f"| {runner} | {q['rows']:,} | {q['wall_s']:.1f} | {q['rows_per_s']:,.0f} | "
                         f"{q['cpu_s']:.0f} | {q['peak_rss_mb']:,.0f} | {q['largest_process_rss_mb']:,.0f} | "
                         f"{q['input_bytes'] / 2**20:,.0f} | {q['output_bytes'] / 2**20:,.0f} |")
    lines += ["", f"## Train (`recpipe train`, embedding-heavy DLRM, width {t['dim']}, {t['steps']} steps of "
              f"{t['batch_size']})", "",
              f"26 hashed tables on a geometric profile summing to each point's rows, every table {t['dim']} wide "
              f"(weights + Adagrad slots: 8 x rows x {t['dim']} bytes), bottom MLP 64, top MLP 256-128, Adagrad, "
              f"fp32, 2 threads; each point trains on its own {t['log_rows']:,}-row Zipf log preprocessed for its "
              "tables. ex/s: steps x batch / wall time of the command (start-up, building and initialising the "
              "tables and the checkpoints included); steady: the second checkpoint interval's rate.", "",
              "| table rows | state MB | wall s | ex/s | ex/s steady | CPU s | peak RSS MB (all processes) | "
              "model dir MB |", "|---|---|---|---|---|---|---|---|"]
    for q in t["points"]:
        lines.append(f"| {q['table_rows']:,} | {q['state_mb']:,.0f} | {q['wall_s']:.1f} | "
                     f"{q['examples_per_s']:,.0f} | {q['examples_per_s_steady']:,.0f} | {q['cpu_s']:.0f} | "
                     f"{q['peak_rss_mb']:,.0f} | {q['model_dir_bytes'] / 2**20:,.0f} |")
    lines += ["", "## Fitted slopes (least squares on log10 size, log10 cost)", "",
              "| ratio | slope | in words | points |", "|---|---|---|---|"]
    for key, s in r["slopes"].items():
        what = "rss" if "_rss_" in key else "time"
        lines.append(f"| {key} | {s['slope']:.3f} | {growth_words(s['slope'], what)} | {s['points']} |")
    if "scaling_train_rss_mb_per_state_mb" in r["ratios"]:
        lines.append(f"| scaling_train_rss_mb_per_state_mb | {r['ratios']['scaling_train_rss_mb_per_state_mb']:.3f} "
                     f"| peak RSS MB added per MB of state added | {len(t['points'])} |")
    lines += ["", "Every point's log (and the training points' shards and model dir) is generated when the point "
              "runs and deleted after it. Reproduce: `.venv/bin/recpipe bench scaling` (`--quick` for the smoke "
              "run).", ""]
    return "\n".join(lines)


def write_png(r: dict, out_dir: str) -> str:
    """bench/results/scaling.png: wall time and peak RSS against size, log-log, each series with its fitted line.

    Args:
        r: the suite's result.
        out_dir: the results folder.

    Returns:
        The PNG's path (replaced whole).
    """
    import matplotlib.pyplot as plt
    plt.switch_backend("Agg")
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5))
    panels = ((axes[0][0], "preprocess", "wall_s", "time"), (axes[0][1], "preprocess", "peak_rss_mb", "rss"),
              (axes[1][0], "train", "wall_s", "time"), (axes[1][1], "train", "peak_rss_mb", "rss"))
    for ax, section, figure, what in panels:
        for runner in (("direct", "dask") if section == "preprocess" else (None,)):
            size, points = _series(r, section, runner)
            if not points:
                continue
            xs, ys = [q[size] for q in points], [q[figure] for q in points]
            slope, intercept = loglog_slope(xs, ys)
            name = runner or "recpipe train"
            line = ax.plot(xs, ys, marker="o", linestyle="none", label=f"{name}: slope {slope:.2f}")[0]
            if not math.isnan(slope):
                ax.plot(xs, [10 ** intercept * x ** slope for x in xs], linestyle="--", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("log rows" if section == "preprocess" else "embedding-table rows")
        ax.set_ylabel("wall s" if what == "time" else "peak RSS MB (process tree)")
        ax.set_title(f"{section}: {'time' if what == 'time' else 'peak RSS'}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=90)
    plt.close(fig)
    path = os.path.join(out_dir, PNG)
    fsio.replace_bytes(path, png.getvalue())
    return path
