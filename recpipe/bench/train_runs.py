"""`recpipe train` runs for the benchmarks: fresh model dirs, configs derived from a base config,
repetitions (round-robin over configurations), steady ex/s and peak RSS per run (and eval AUC when
asked); the peers (recpipe.bench.tfrs_peer, recpipe.bench.horovod_peer) run in the same round robin."""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import yaml

from recpipe.bench.common import CLI, evaluate_model, run_measured, summary
from recpipe.trainers.model_dir import ModelDir

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

    def _once(self, name: str, data: str, cfg_path: str, steps: int, flags: tuple, keep: bool,
              auc: bool = False) -> dict:
        """One `recpipe train` in a fresh model dir: {"rate": steady ex/s, "rss": peak MB[, "auc": eval AUC
        as `recpipe evaluate` scores it (common.evaluate_model)]}."""
        model_dir = os.path.join(self.work, "models", name)
        shutil.rmtree(model_dir, ignore_errors=True)
        _, peak, _ = run_measured([*CLI, "train", "--data", data, "--model-dir", model_dir, "--config", cfg_path,
                                   "--steps", str(steps), *flags])
        got = {"rate": ModelDir(model_dir).state().examples_per_sec_steady, "rss": peak}
        if auc:
            got["auc"] = evaluate_model(model_dir, data)["auc"]
        if not keep:
            shutil.rmtree(model_dir, ignore_errors=True)
        return got

    @staticmethod
    def _peer_once(cmd: list[str]) -> dict:
        """One run of a peer module in fresh processes. It prints one JSON line per process (under
        horovodrun prefixed by the rank); every rank must end with the same weights."""
        _, peak, out = run_measured(cmd)
        lines = []
        for line in out.splitlines():
            try:
                lines.append(json.loads(line[line.index("{"):]))
            except ValueError:  # no JSON on this line
                continue
        main = next(r for r in lines if "examples_per_s_steady" in r)
        sums = [r["weights_abs_sum"] for r in lines if "weights_abs_sum" in r]
        if sums and max(sums) - min(sums) > 1e-6 * max(sums):
            raise RuntimeError(f"{' '.join(cmd[:8])}...: the ranks ended with different weights ({sums}): "
                               f"the peer's gradients were not exchanged")
        return {"rate": main["examples_per_s_steady"], "rss": peak, "auc": main["auc"]}

    def _record(self, name: str, got: list[dict], steps: int, flags: tuple, t0: float, **extra) -> dict:
        rates = [g["rate"] for g in got]
        r = {"examples_per_s": summary(rates), "peak_rss_mb": summary([g["rss"] for g in got]), "steps": steps,
             "flags": list(flags), **extra}
        if all("auc" in g for g in got):
            r["eval_auc"] = summary([g["auc"] for g in got])
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
        return self._record(name, got, steps, flags, t0)

    def plan(self, name: str, data: str, cfg_path: str, steps: int, *flags: str, copies: int = 1,
             auc: bool = False) -> None:
        """Queue a configuration for run_planned(); copies > 1: that many independent runs AT ONCE
        (ex/s is their sum; two one-thread processes exchanging nothing are this box's ceiling for
        any 2-process scaling). auc: each run's model is also scored on the eval split."""
        self.planned.append((name, steps, flags, copies,
                             lambda tag: self._once(tag, data, cfg_path, steps, flags, False, auc)))

    def plan_peer(self, name: str, data: str, cfg_path: str, steps: int, precision: str) -> None:
        """Queue the TFRS-tutorial peer of a config (same model, data in memory, model.fit)."""
        cmd = [sys.executable, "-m", "recpipe.bench.tfrs_peer", data, cfg_path, str(steps), precision]
        self.planned.append((name, steps, ("tfrs_peer", precision), 1, lambda tag: self._peer_once(cmd)))

    def plan_horovod_peer(self, name: str, data: str, cfg_path: str, steps: int, np: int,
                          cycle_time_ms: Optional[float] = None) -> None:
        """Queue the plain-Horovod peer (Horovod's Keras example way, dense gradients) at np ranks, with
        Horovod's own cycle time unless `cycle_time_ms` is given (horovodrun --cycle-time-ms)."""
        from recpipe.trainers.strategies.hvd_launch import horovodrun
        cycle = [] if cycle_time_ms is None else ["--cycle-time-ms", f"{cycle_time_ms:g}"]
        cmd = [horovodrun(), "-np", str(np), "-H", f"localhost:{np}", "--gloo", *cycle, sys.executable, "-m",
               "recpipe.bench.horovod_peer", data, cfg_path, str(steps)]
        self.planned.append((name, steps, ("plain_horovod", f"np={np}"), 1, lambda tag: self._peer_once(cmd)))

    def run_planned(self) -> None:
        """Every queued configuration once per repetition, round-robin: a drift of the shared
        machine's speed during the suite hits all of them alike instead of the ones run last."""
        got: dict[str, list] = {p[0]: [] for p in self.planned}
        t0 = time.perf_counter()
        for rep in range(self.reps):
            for name, _, _, copies, once in self.planned:
                with ThreadPoolExecutor(copies) as pool:
                    done = list(pool.map(lambda i: once(f"{name}-{rep}-{i}"), range(copies)))
                got[name].append({**done[0], "rate": sum(d["rate"] for d in done),
                                  "rss": max(d["rss"] for d in done)})
            self.say(f"bench train: repetition {rep + 1}/{self.reps} of {len(self.planned)} configurations done "
                     f"[{time.perf_counter() - t0:.0f} s]")
        for name, steps, flags, copies, _ in self.planned:
            self._record(name, got[name], steps, flags, t0, **({"copies": copies} if copies > 1 else {}))
        self.planned = []

    def median(self, name: str, key: str = "examples_per_s") -> float:
        return self.results[name][key]["median"]
