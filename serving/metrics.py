"""Server metrics in Prometheus' text exposition format (GET /monitoring/prometheus/metrics).

Counters by label set and cumulative histograms, guarded by one lock; no dependency on a client
library, since the format is a few lines of text.
"""
from __future__ import annotations

import bisect
import threading
from collections import defaultdict

__all__ = ["Metrics", "LATENCY_BUCKETS_S", "BATCH_BUCKETS"]

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self._hists: dict[str, dict[tuple, _Histogram]] = defaultdict(dict)
        self._gauges: dict[str, dict[tuple, float]] = defaultdict(dict)
        self._help: dict[str, tuple[str, str]] = {}

    def inc(self, name: str, help_text: str, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._help.setdefault(name, ("counter", help_text))
            self._counters[name][tuple(sorted(labels.items()))] += value

    def observe(self, name: str, help_text: str, value: float, buckets: tuple[float, ...], **labels: str) -> None:
        with self._lock:
            self._help.setdefault(name, ("histogram", help_text))
            key = tuple(sorted(labels.items()))
            hist = self._hists[name].get(key)
            if hist is None:
                hist = self._hists[name][key] = _Histogram(buckets)
            hist.observe(value)

    def set(self, name: str, help_text: str, value: float, **labels: str) -> None:
        with self._lock:
            self._help.setdefault(name, ("gauge", help_text))
            self._gauges[name][tuple(sorted(labels.items()))] = value

    def counter_value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, (kind, help_text) in sorted(self._help.items()):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                if kind == "counter":
                    for key, v in sorted(self._counters[name].items()):
                        lines.append(f"{name}{_labels(dict(key))} {v:g}")
                elif kind == "gauge":
                    for key, v in sorted(self._gauges[name].items()):
                        lines.append(f"{name}{_labels(dict(key))} {v:g}")
                else:
                    for key, h in sorted(self._hists[name].items()):
                        cumulative = 0
                        for bound, count in zip([*h.buckets, float("inf")], h.counts):
                            cumulative += count
                            le = "+Inf" if bound == float("inf") else f"{bound:g}"
                            lines.append(f"{name}_bucket{_labels({**dict(key), 'le': le})} {cumulative}")
                        lines.append(f"{name}_sum{_labels(dict(key))} {h.sum:g}")
                        lines.append(f"{name}_count{_labels(dict(key))} {cumulative}")
        return "\n".join(lines) + "\n"
