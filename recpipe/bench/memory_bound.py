"""The memory bound a training process is held to (its peak RSS close to its state): its peak RSS against
PER_STATE x (its weights and optimizer slots) + BASE_MB, and a PS task's against PER_STATE x its share of them +
its own base (the RSS of the task before any variable is placed on it). A ratio <= 1 meets the bound."""
from __future__ import annotations

__all__ = ["PER_STATE", "BASE_MB", "bound_mb", "rss_vs_bound", "ps_tasks_vs_bound"]

PER_STATE = 1.3
BASE_MB = 800.0


def bound_mb(state_mb: float, base_mb: float = BASE_MB) -> float:
    """The peak RSS a process holding `state_mb` of state may reach.

    Args:
        state_mb: MB of weights and optimizer slots the process holds.
        base_mb: what it may hold beside them (TensorFlow, the input pipeline, the traced step).

    Returns:
        PER_STATE x state_mb + base_mb.
    """
    return PER_STATE * state_mb + base_mb


def rss_vs_bound(peak_rss_mb: float, state_mb: float, base_mb: float = BASE_MB) -> float:
    """Peak RSS over the bound (<= 1: within it).

    Args:
        peak_rss_mb: the process's peak RSS, MB.
        state_mb: MB of weights and optimizer slots it holds.
        base_mb: the bound's base (bound_mb).

    Returns:
        peak_rss_mb / bound_mb(state_mb, base_mb).

    Raises:
        ValueError: a bound of zero or below.
    """
    bound = bound_mb(state_mb, base_mb)
    if bound <= 0:
        raise ValueError(f"memory bound {bound} MB: state {state_mb} MB, base {base_mb} MB")
    return peak_rss_mb / bound


def ps_tasks_vs_bound(tasks: dict[str, dict]) -> dict[str, float]:
    """Each PS task's peak RSS over PER_STATE x its share of the state + its own base.

    Args:
        tasks: {task: {"peak_rss_mb", "state_mb", "base_rss_mb"}}, e.g. {"ps:0": {...}, "ps:1": {...}}.

    Returns:
        {task: ratio}.
    """
    return {t: rss_vs_bound(d["peak_rss_mb"], d["state_mb"], d["base_rss_mb"]) for t, d in sorted(tasks.items())}
