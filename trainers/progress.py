"""A terminal progress bar for training: `[#######.......] 300/600 50% 12,345 ex/s loss 0.4512 eta 0:10`.

Drawn in place on stderr when it is a terminal (redrawn at most every `interval` seconds);
silent otherwise, where the per-checkpoint progress lines are the log.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["ProgressBar", "render"]


def render(step: int, total: int, rate: float, loss: Optional[float], eta_s: Optional[float], width: int = 28) -> str:
    frac = min(max(step / total, 0.0), 1.0) if total else 1.0
    filled = int(round(frac * width))
    loss_s = f" loss {loss:.4f}" if loss is not None else ""
    eta = f" eta {int(eta_s) // 60}:{int(eta_s) % 60:02d}" if eta_s is not None else ""
    rate_s = f" {rate:,.0f} ex/s" if rate else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {step}/{total} {frac:4.0%}{rate_s}{loss_s}{eta}"


class ProgressBar:
    def __init__(self, total: int, start: int, batch_size: int, stream: TextIO | None = None,
                 interval: float = 0.5, enabled: Optional[bool] = None):
        self.total, self.start, self.batch_size = total, start, batch_size
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval = interval
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self.step = start
        self.loss: Optional[float] = None

    def update(self, step: int, loss: Optional[float] = None, force: bool = False) -> None:
        self.step = step
        if loss is not None:
            self.loss = loss
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._last_draw < self.interval):
            return
        self._last_draw = now
        elapsed = max(now - self.t0, 1e-9)
        done = step - self.start
        rate = done * self.batch_size / elapsed
        eta = (self.total - step) * elapsed / done if done else None
        self.stream.write("\r" + render(step, self.total, rate, self.loss, eta) + "\033[K")
        self.stream.flush()

    def clear(self) -> None:
        """Erase the bar (before a log line is printed); the next update redraws it."""
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._last_draw = 0.0

    def close(self) -> None:
        if self.enabled:
            self.update(self.step, force=True)
            self.stream.write("\n")
            self.stream.flush()
