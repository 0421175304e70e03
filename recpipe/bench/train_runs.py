"""`recpipe train` runs for the benchmarks: fresh model dirs, configs derived from a base config,
repetitions (round-robin over configurations), steady ex/s and peak RSS per run."""
from __future__ import annotations

import copy
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import yaml

from recpipe.bench.common import CLI, run_measured, summary
from trainers.model_dir import ModelDir

__all__ = ["TrainRuns"]


class TrainRuns:
    """`recpipe train` runs in fresh model dirs; results keyed by name."""

    def __init__(self, work: str, reps: int, say: Callable[[str], None]):
        self.work, self.reps, self.say = work, reps, say
        self.results: dict[str, dict] = {}
        self.planned: list[tuple] = []

    def config(self, name: str, base: dict, **overrides) -> str:
        cfg = copy.deepcopy(base)
        for section, values in overrides.items():
            if isinstance(values, dict) and isinstance(cfg.get(section), dict) and section != "model":
                cfg[section] = {**cfg[section], **values}
            else:
                cfg[section] = values
        path = os.path.join(self.work, f"{name}.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(cfg, fh)
        return path

    def _once(self, name: str, data: str, cfg_path: str, steps: int, flags: tuple, keep: bool) -> tuple[float, float]:
        """One `recpipe train` in a fresh model dir: (steady ex/s, peak RSS MB)."""
        model_dir = os.path.join(self.work, "models", name)
        shutil.rmtree(model_dir, ignore_errors=True)
        _, peak, _ = run_measured([*CLI, "train", "--data", data, "--model-dir", model_dir, "--config", cfg_path,
                                   "--steps", str(steps), *flags])
        state = ModelDir(model_dir).state()
        if not keep:
            shutil.rmtree(model_dir, ignore_errors=True)
        return state.examples_per_sec_steady, peak

    def _record(self, name: str, rates: list, rss: list, steps: int, flags: tuple, t0: float, **extra) -> dict:
        r = {"examples_per_s": summary(rates), "peak_rss_mb": summary(rss), "steps": steps, "flags": list(flags),
             **extra}
        self.results[name] = r
        self.say(f"bench train: {name}: median {r['examples_per_s']['median']:,.0f} ex/s "
                 f"(min {min(rates):,.0f}, max {max(rates):,.0f}), peak RSS {r['peak_rss_mb']['median']:,.0f} MB "
                 f"[{time.perf_counter() - t0:.0f} s]")
        return r

    def run(self, name: str, data: str, cfg_path: str, steps: int, *flags: str, reps: Optional[int] = None,
            keep: bool = False) -> dict:
        """`reps` runs of one configuration, one after another."""
        t0 = time.perf_counter()
        got = [self._once(f"{name}-{rep}", data, cfg_path, steps, flags, keep) for rep in range(reps or self.reps)]
        return self._record(name, [g[0] for g in got], [g[1] for g in got], steps, flags, t0)

    def plan(self, name: str, data: str, cfg_path: str, steps: int, *flags: str, copies: int = 1) -> None:
        """Queue a configuration for run_planned(); copies > 1: that many independent runs AT ONCE
        (ex/s is their sum; two one-thread processes exchanging nothing are this box's ceiling for
        any 2-process scaling)."""
        self.planned.append((name, data, cfg_path, steps, flags, copies))

    def run_planned(self) -> None:
        """Every queued configuration once per repetition, round-robin: a drift of the shared
        machine's speed during the suite hits all of them alike instead of the ones run last."""
        got: dict[str, list] = {p[0]: [] for p in self.planned}
        t0 = time.perf_counter()
        for rep in range(self.reps):
            for name, data, cfg_path, steps, flags, copies in self.planned:
                with ThreadPoolExecutor(copies) as pool:
                    done = list(pool.map(lambda i: self._once(f"{name}-{rep}-{i}", data, cfg_path, steps, flags, False),
                                         range(copies)))
                got[name].append((sum(d[0] for d in done), max(d[1] for d in done)))
            self.say(f"bench train: repetition {rep + 1}/{self.reps} of {len(self.planned)} configurations done "
                     f"[{time.perf_counter() - t0:.0f} s]")
        for name, data, cfg_path, steps, flags, copies in self.planned:
            self._record(name, [g[0] for g in got[name]], [g[1] for g in got[name]], steps, flags, t0,
                         **({"copies": copies} if copies > 1 else {}))
        self.planned = []

    def median(self, name: str, key: str = "examples_per_s") -> float:
        return self.results[name][key]["median"]
