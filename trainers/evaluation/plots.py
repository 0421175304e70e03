"""The evaluation plots `recpipe evaluate` leaves in the model dir (PNG, matplotlib's Agg backend)."""
from __future__ import annotations

from recpipe.common import fsio

__all__ = ["reliability_png", "slices_png"]


def _save(fig, path: str) -> str:
    import io

    import matplotlib.pyplot as plt
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    fsio.replace_bytes(path, png.getvalue(), only_if_changed=True)
    return path


def slices_png(slices: dict[str, list[dict]], metric: str, path: str) -> str:
    """One bar chart per slicing (config evaluate.slices): the metric per slice, rows in the labels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(slices), 1, figsize=(7, 2.6 * len(slices)), squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], slices.items()):
        labels = [f"{r['slice'][:18]}\n({r['rows']})" for r in rows]
        values = [r[metric] if r[metric] == r[metric] else 0.0 for r in rows]  # NaN (one class): drawn as 0
        ax.bar(range(len(rows)), values, color="tab:blue")
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set(ylabel=metric, title=f"{metric} per slice: {name} (eval split; rows in brackets)")
        if metric == "auc":
            ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    return _save(fig, path)


def reliability_png(reliability: list[dict], positive_rate: float, path: str) -> str:
    """The reliability curve: observed click rate against mean prediction per bin (the diagonal is
    perfect calibration), each point sized by its rows. Written only when its bytes change, so a
    rerun of an evaluation leaves the file untouched (as metrics.json)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    top = max([0.05, positive_rate, *(r["mean_prediction"] for r in reliability),
               *(r["observed_rate"] for r in reliability)]) * 1.05
    ax.plot([0, top], [0, top], color="grey", linewidth=1, label="calibrated")
    rows = max((r["rows"] for r in reliability), default=1)
    ax.scatter([r["mean_prediction"] for r in reliability], [r["observed_rate"] for r in reliability],
               s=[20 + 200 * r["rows"] / rows for r in reliability], label="eval bins (size: rows)")
    ax.plot([r["mean_prediction"] for r in reliability], [r["observed_rate"] for r in reliability])
    ax.axhline(positive_rate, color="tab:red", linestyle=":", linewidth=1, label=f"click rate {positive_rate:.3f}")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="mean prediction", ylabel="observed click rate",
           title="Reliability (eval split)")
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)
