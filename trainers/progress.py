"""Training progress: human lines, a terminal bar, and the same events as JSON lines.

A training loop reports through a `Reporter`: each checkpoint interval's end becomes a
`StepReport` (one human line `train: step 300/600 loss 0.4512 auc 0.7410 (41,000 ex/s)`, the bar,
and, when the reporter has an events file, one JSON object per line). A launcher that runs the
loop in other processes (Horovod's ranks) follows that file with `follow_events` and shows the
same lines: the protocol between processes is the JSON, never the log text.

The bar (`[#######.......] 300/600 50% 12,345 ex/s loss 0.4512 eta 0:10`) is drawn in place on
stderr when it is a terminal; silent otherwise, where the lines are the log.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, TextIO

__all__ = ["ProgressBar", "render", "StepReport", "Reporter", "follow_events", "steady_rate"]

EVENTS_ENV = "RECPIPE_PROGRESS_FILE"  # where rank 0 of a launched job writes its events


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


@dataclass(frozen=True)
class StepReport:
    """The end of one checkpoint interval."""
    step: int
    total: int
    loss: float
    examples_per_s: float
    auc: Optional[float] = None
    ranks: Optional[int] = None   # Horovod: ranks in the job

    def line(self) -> str:
        auc = f" auc {self.auc:.4f}" if self.auc is not None else ""
        ranks = f", {self.ranks} ranks" if self.ranks else ""
        return (f"train: step {self.step}/{self.total} loss {self.loss:.4f}{auc} "
                f"({self.examples_per_s:,.0f} ex/s{ranks})")


def steady_rate(first: tuple[int, float] | None, last: tuple[int, float] | None, examples_per_step: int,
                overall: float) -> float:
    """ex/s between the end of the first checkpoint interval (after its save) and the end of the last
    (before its save): no graph tracing, XLA compiling, warm-up or first/last checkpoint writes in it.
    The overall rate when the run had a single interval."""
    if first is None or last is None or last[0] <= first[0]:
        return overall
    return (last[0] - first[0]) * examples_per_step / max(last[1] - first[1], 1e-9)


class Reporter:
    """What one training loop reports. `examples_per_step` is the global batch (all replicas/ranks)."""

    def __init__(self, say: Callable[[str], None], total: int, start: int, examples_per_step: int,
                 ranks: Optional[int] = None, events_path: Optional[str] = None, bar: Optional[ProgressBar] = None):
        self.say, self.total, self.start, self.ranks = say, total, start, ranks
        self.examples_per_step = examples_per_step
        self.bar = bar or ProgressBar(total, start, examples_per_step)
        self._events = open(events_path, "a") if events_path else None
        self.t0 = time.perf_counter()
        self.first: tuple[int, float] | None = None   # (step, time) at the end of the first interval
        self.last: tuple[int, float] | None = None    # ... and of the latest one (before its save)
        self.last_loss = float("nan")

    # ------------------------------------------------------------ the loop's side
    def note(self, text: str) -> None:
        """A line that is not a step (resuming, warm start, ...)."""
        self._show_note(text)
        self._emit({"kind": "note", "text": text})

    def batch(self, step: int) -> None:
        """One step done (the bar only)."""
        self.bar.update(step)

    def interval_end(self, step: int) -> None:
        """Mark the end of an interval BEFORE its checkpoint is written (for the steady rate)."""
        self.last = (step, time.perf_counter())

    def interval(self, step: int, loss: float, auc: Optional[float] = None) -> StepReport:
        """An interval ended at `step` (its checkpoint written): the line, the bar, the event."""
        if self.first is None:
            self.first = (step, time.perf_counter())
        self.last_loss = loss
        rate = (step - self.start) * self.examples_per_step / max(time.perf_counter() - self.t0, 1e-9)
        report = StepReport(step, self.total, loss, rate, auc, self.ranks)
        self._show(report)
        self._emit({"kind": "step", **dataclasses.asdict(report)})
        return report

    def rates(self, done: int) -> tuple[float, float]:
        """(ex/s over this run, steady ex/s) once `done` steps are done."""
        overall = (done - self.start) * self.examples_per_step / max(time.perf_counter() - self.t0, 1e-9)
        return overall, steady_rate(self.first, self.last, self.examples_per_step, overall)

    def close(self) -> None:
        if self.bar.step >= self.total:
            self.bar.close()
        if self._events is not None:
            self._events.close()
            self._events = None

    # ------------------------------------------------------------ the launcher's side
    def replay(self, event: dict) -> None:
        """Show an event another process's Reporter wrote."""
        if event.get("kind") == "note":
            self._show_note(event["text"])
        elif event.get("kind") == "step":
            fields = {f.name for f in dataclasses.fields(StepReport)}
            self._show(StepReport(**{k: v for k, v in event.items() if k in fields}))

    # ------------------------------------------------------------ internals
    def _show_note(self, text: str) -> None:
        self.bar.clear()
        self.say(text)

    def _show(self, report: StepReport) -> None:
        self.bar.clear()
        self.say(report.line())
        self.bar.update(report.step, report.loss, force=True)

    def _emit(self, event: dict) -> None:
        if self._events is not None:
            self._events.write(json.dumps(event) + "\n")
            self._events.flush()


def follow_events(path: str, on_event: Callable[[dict], None], done: threading.Event, poll_s: float = 0.2) -> None:
    """Call on_event for every JSON line appended to `path` until `done` is set (then drain the rest).
    Lines that are not complete JSON yet are read again on the next poll."""
    offset = 0
    while True:
        finished = done.is_set()
        if os.path.exists(path):
            with open(path) as fh:
                fh.seek(offset)
                while True:
                    line = fh.readline()
                    if not line.endswith("\n"):
                        break
                    offset = fh.tell()
                    try:
                        on_event(json.loads(line))
                    except ValueError:
                        continue
        if finished:
            return
        done.wait(poll_s)
