"""`recpipe bench embedding`: training an embedding-heavy DLRM (recpipe.bench.embedding_model: 26 hashed tables
of 10.4M rows in all, 32 wide, against a bottom MLP 64 and a top MLP 256-128) on a Zipf-skewed generated log
(recpipe.bench.zipf_log), preprocessed by `recpipe preprocess`, side by side with the tools a user would pick
instead. Contenders, round-robin, each a fresh process, the same examples, batch, threads, optimizer and fp32:
  - `recpipe train` on the config (steady ex/s of the second checkpoint interval, peak RSS, eval AUC);
  - the TFRS-tutorial way (recpipe.bench.tfrs_dlrm_peer: Keras Embeddings, DotInteraction, data in memory,
    model.fit);
  - TorchRec's DLRM (recpipe.bench.torchrec_peer: FusedEmbeddingBagCollection, FBGEMM's CPU TBE kernels with
    fused EXACT_ADAGRAD, a plain PyTorch loop) in an environment the bench creates, on our shards exported
    to .npz.
The full run also splits both steps into parts (input, lookup, interaction, MLPs, optimizers) on
fixed batches (recpipe.bench.embedding_parts and the script's own timing), and our step's kernels are profiled by
group (STEP_GROUPS). The peak RSS of our training process is also set against the bytes of its state (weights and
Adagrad accumulators): train_rss_vs_state, and against the bound 1.3 x state + 800 MB
(recpipe.bench.memory_bound): train_rss_vs_bound. The same model on a local PS cluster (2 PS tasks, 1 worker) sets
each PS task's peak RSS against 1.3 x its share + its own base (recpipe.bench.ps_memory):
train_ps_task_rss_vs_bound.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import yaml

from recpipe.bench.common import CLI, run_measured
from recpipe.bench.embedding_model import EmbeddingHeavySpec, bench_config, param_counts, state_bytes, table_rows
from recpipe.bench.memory_bound import BASE_MB, PER_STATE, bound_mb, rss_vs_bound
from recpipe.bench.ps_memory import bench_ps_memory
from recpipe.bench.ps_memory import markdown as markdown_ps
from recpipe.bench.targets import TARGETS
from recpipe.bench.train_runs import TrainRuns
from recpipe.bench.zipf_log import write_zipf_log

__all__ = ["EmbeddingBenchOptions", "STEP_GROUPS", "spec_for", "bench_embedding", "bench_memory", "merge_memory",
           "ratios", "explain", "markdown"]


@dataclass(frozen=True)
class EmbeddingBenchOptions:
    """How `recpipe bench embedding` runs.

    Attributes:
        quick: the smoke run: 260k table rows, 30k log rows, 20 steps.
        reps: round-robin repetitions of every contender.
        steps: training steps of every contender (default: 20 quick, 1000 full).
        torchrec: run the TorchRec contender (it creates its environment, about 5.5 GB, when missing).
        env_cache: where the TorchRec environment lives (default: recpipe.bench.isolated_env.env_cache()).
        ps_memory: also train on a local PS cluster and measure each PS task's memory (recpipe.bench.ps_memory).
    """
    quick: bool = False
    reps: int = 3
    steps: Optional[int] = None
    torchrec: bool = True
    env_cache: Optional[str] = None
    ps_memory: bool = True


def spec_for(o: EmbeddingBenchOptions) -> EmbeddingHeavySpec:
    """The model and log of a run.

    Args:
        o: the options.

    Returns:
        The full model (10.4M rows, a 1.2M-row log), or the quick one (260k rows, a 30k-row log).
    """
    if o.quick:
        return EmbeddingHeavySpec(total_rows=260_000, smallest=100, log_rows=30_000)
    return EmbeddingHeavySpec(log_rows=1_200_000)


def _peer_once(cmd: list[str]) -> dict:
    """One run of a peer module printing one JSON line: its steady rate, peak RSS and eval AUC."""
    _, peak, out = run_measured(cmd)
    got = json.loads(out.strip().splitlines()[-1])
    return {"rate": got["examples_per_s_steady"], "rss": peak, "auc": got["auc"]}


def _prepare(spec: EmbeddingHeavySpec, steps: int, work: str, say: Callable[[str], None]) -> tuple[str, str, dict]:
    """The config file, the preprocessed data (generated log -> `recpipe preprocess`) and what it took."""
    cfg = bench_config(spec)
    cfg["train"]["checkpoint_every"] = max(steps // 2, 1)  # the steady rate is the second interval's
    cfg_path = os.path.join(work, "embedding_heavy.yaml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    t0 = time.perf_counter()
    log = write_zipf_log(spec, os.path.join(work, "log"))
    generated = time.perf_counter() - t0
    pre = os.path.join(work, "pre")
    shutil.rmtree(pre, ignore_errors=True)
    wall, peak, _ = run_measured([*CLI, "preprocess", "--config", cfg_path, "--input", log, "--output", pre])
    say(f"bench embedding: {spec.log_rows:,} rows generated in {generated:.0f} s, preprocessed in {wall:.0f} s")
    return cfg_path, pre, {"generate_s": generated, "preprocess_s": wall, "preprocess_peak_rss_mb": peak}


def bench_embedding(o: EmbeddingBenchOptions, work: str, say: Callable[[str], None]) -> dict:
    """Run the suite.

    Args:
        o: the options.
        work: a work folder (the log, the preprocessed data, the models and the peers' files; reused).
        say: progress messages.

    Returns:
        The suite's result: config, sizes, runs (ex/s, peak RSS, eval AUC), parts and ratios.
    """
    from recpipe.features.config import load_config
    from recpipe.features.preprocessed import PreprocessedData
    os.makedirs(work, exist_ok=True)
    spec, steps = spec_for(o), o.steps or (20 if o.quick else 1000)
    cfg_path, pre, data = _prepare(spec, steps, work, say)
    cfg = load_config(cfg_path)
    sizes = PreprocessedData(pre).transform().table_sizes()
    rows = [sizes[f.name] for f in cfg.features.sparse]
    runs = TrainRuns(work, o.reps, say)
    runs.plan("recpipe_train", pre, cfg_path, steps, auc=True)
    peer = [sys.executable, "-m", "recpipe.bench.tfrs_dlrm_peer", pre, cfg_path, str(steps)]
    runs.planned.append(("tfrs_fit", steps, ("tfrs_dlrm_peer",), 1, lambda tag: _peer_once(peer)))
    torchrec: dict = {}
    if o.torchrec:
        from recpipe.bench.torchrec_peer import export_split, run_torchrec, torchrec_request
        for split in ("train", "eval"):
            export_split(cfg, pre, split, os.path.join(work, f"{split}.npz"))

        def torchrec_once(tag: str) -> dict:
            got = run_torchrec(torchrec_request(spec, rows, steps, work, tag), run_measured, say, o.env_cache)
            torchrec.update({k: got[k] for k in ("versions", "fused_optimizer", "threads", "env")})
            return {"rate": got["examples_per_s_steady"], "rss": got["peak_rss_mb"], "auc": got["auc"]}
        runs.planned.append(("torchrec", steps, ("torchrec_dlrm",), 1, torchrec_once))
    runs.run_planned()

    state_mb = state_bytes(spec) / 2**20
    found = ratios(runs.results, state_mb)
    ps_memory: dict = {}
    if o.ps_memory:  # a failure here costs the PS figure, not the contenders' runs before it
        try:
            ps_memory = bench_ps_memory(pre, cfg_path, 20 if o.quick else 100, work, say)
            found.update(ps_memory["ratios"])
        except RuntimeError as e:
            say(f"bench embedding: PS memory run failed: {e}")
            ps_memory = {"error": str(e)}
    parts: dict = {}
    if not o.quick:  # the quick run's sizes say nothing of speed
        parts = _parts(spec, rows, pre, cfg_path, work, o, say)
    return {"suite": "embedding", "quick": o.quick, "reps": o.reps, "steps": steps,
            "spec": dataclasses.asdict(spec), "table_rows": rows, "configured_table_rows": table_rows(spec),
            "params": {"recpipe": param_counts(spec)},
            "state_mb": state_mb, "data": data, "runs": runs.results, "torchrec": torchrec, "parts": parts,
            "ps_memory": ps_memory, "ratios": found}


def bench_memory(o: EmbeddingBenchOptions, work: str, say: Callable[[str], None]) -> dict:
    """The suite's memory figures alone: `recpipe train`'s peak RSS (o.reps runs) and, with o.ps_memory, the PS
    tasks' (recpipe.bench.ps_memory), without the peers' runs (merge_memory puts them into a full run's result).

    Args:
        o: the options (torchrec is not read).
        work: a work folder, as bench_embedding's.
        say: progress messages.

    Returns:
        {"steps", "reps", "state_mb", "recpipe_train": TrainRuns' summary, "ps_memory", "ratios"}.
    """
    os.makedirs(work, exist_ok=True)
    spec, steps = spec_for(o), o.steps or (20 if o.quick else 1000)
    cfg_path, pre, _ = _prepare(spec, steps, work, say)
    runs = TrainRuns(work, o.reps, say)
    runs.plan("recpipe_train", pre, cfg_path, steps)
    runs.run_planned()
    state_mb = state_bytes(spec) / 2**20
    peak = runs.results["recpipe_train"]["peak_rss_mb"]["median"]
    found = {"train_rss_vs_state": peak / state_mb, "train_rss_vs_bound": rss_vs_bound(peak, state_mb)}
    ps_memory = bench_ps_memory(pre, cfg_path, 20 if o.quick else 100, work, say) if o.ps_memory else {}
    found.update(ps_memory.get("ratios", {}))
    return {"steps": steps, "reps": o.reps, "state_mb": state_mb, "recpipe_train": runs.results["recpipe_train"],
            "ps_memory": ps_memory, "ratios": found}


def merge_memory(result: dict, memory: dict, machine: dict) -> dict:
    """A full run's result with its memory figures measured again alone (bench_memory), the contenders' runs kept.

    Args:
        result: bench_embedding's result (with "machine").
        memory: bench_memory's result.
        machine: recpipe.bench.common.machine_info() of the memory run.

    Returns:
        A new result: "memory_run" (the memory run, with its machine), "ps_memory" and the memory ratios replaced.
    """
    return {**result, "memory_run": {**{k: v for k, v in memory.items() if k != "ps_memory"}, "machine": machine},
            "ps_memory": memory.get("ps_memory", {}), "ratios": {**result.get("ratios", {}), **memory["ratios"]}}


def ratios(results: dict, state_mb: float) -> dict:
    """The suite's ratios from its runs' summaries (TorchRec's when it ran).

    Args:
        results: {contender: {"examples_per_s": {"median"}, "eval_auc": {"median"}, "peak_rss_mb": {"median"}}}
            for recpipe_train, tfrs_fit and, optionally, torchrec.
        state_mb: MB of recpipe's training state (weights + Adagrad accumulators).

    Returns:
        {ratio key: value}.
    """
    def med(name: str, key: str = "examples_per_s") -> float:
        return results[name][key]["median"]

    peak = med("recpipe_train", "peak_rss_mb")
    out = {"train_rss_vs_state": peak / state_mb, "train_rss_vs_bound": rss_vs_bound(peak, state_mb)}
    for peer in ("tfrs_fit", "torchrec"):
        key = f"train_embedding_heavy_vs_{peer}"
        if peer in results:
            out[key] = med("recpipe_train") / med(peer)
            out[f"{key}_auc"] = med("recpipe_train", "eval_auc") / med(peer, "eval_auc")
    return out


SPEED_KEYS = ("train_embedding_heavy_vs_tfrs_fit", "train_embedding_heavy_vs_torchrec")


def _parts(spec: EmbeddingHeavySpec, rows: list[int], pre: str, cfg_path: str, work: str,
           o: EmbeddingBenchOptions, say: Callable[[str], None]) -> dict:
    """Our step and (with o.torchrec) TorchRec's split into parts on fixed in-memory batches, each in a fresh
    process."""
    from recpipe.bench.torchrec_peer import run_torchrec, torchrec_request
    rounds, steps = (1, 3) if o.quick else (3, 30)
    say("bench embedding: the parts of both steps")
    _, _, out = run_measured([sys.executable, "-m", "recpipe.bench.embedding_parts", pre, cfg_path, str(steps),
                              str(rounds)])
    ours = json.loads(out.strip().splitlines()[-1])
    theirs = None
    if o.torchrec:
        req = torchrec_request(spec, rows, 20 if o.quick else 100, work, "torchrec_parts", parts=(rounds, steps))
        theirs = run_torchrec(req, run_measured, say, o.env_cache)["parts_ms"]
    return {"rounds": rounds, "steps": steps, "recpipe_ms": ours["parts_ms"], "torchrec_ms": theirs,
            "recpipe_detail": ours}


PARTS = (("input", "input: shards or memory to a batch (overlapped with the step in training)"),
         ("lookup_forward", "embedding lookup, forward"),
         ("interaction", "dot interaction, forward + backward"),
         ("mlp", "bottom and top MLPs, forward + backward"),
         ("dense_optimizer", "Adagrad on the dense weights"),
         ("lookup_backward_sparse_update_loss", "the rest: lookup backward, the tables' Adagrad, the loss"),
         ("step", "whole step (no input)"))


STEP_GROUPS = {  # recpipe.bench.embedding_parts.dlrm_group's groups of our step's kernels
    "lookup_forward": "ID dedup and lookups, forward (unique, table gather, gather back to the batch)",
    "lookup_backward": "the lookups' backward (row gradients summed per distinct ID)",
    "tables_adagrad": "the tables' Adagrad (accumulator rows gathered, both slots' rows updated, scattered back)",
    "interaction_products": "the interaction's batched matmuls",
    "interaction_layout": "the interaction's copies (features concatenated, products transposed and gathered, "
                          "and their gradients)",
    "mlps": "the MLPs and the logit",
    "dense_adagrad": "Adagrad on the dense weights",
    "loss_metrics_other": "the loss, the AUC metric and the rest",
}


def _step_kernels_text(r: dict) -> str:
    """Our step's profiled kernel time by group, largest first, in words."""
    groups = r["parts"].get("recpipe_detail", {}).get("step_kernel_ms")
    if not groups:
        return ""
    order = sorted(groups, key=lambda k: -groups[k])
    return (f" Profiled inside the step, its kernels take {sum(groups.values()):.1f} ms per step summed over both "
            f"threads (a kernel waiting for a busy thread to run its share counts the wait): "
            + "; ".join(f"{STEP_GROUPS.get(k, k)} {groups[k]:.1f}" for k in order) + ".")


def _parts_text(r: dict) -> str:
    """The parts of both steps, largest gap first, in words."""
    if not r.get("parts", {}).get("torchrec_ms"):
        return ""
    a, b = r["parts"]["recpipe_ms"], r["parts"]["torchrec_ms"]
    keys = [k for k, _ in PARTS if k in a and k in b and k != "step"]
    gaps = sorted(keys, key=lambda k: a[k] - b[k], reverse=True)
    label = dict(PARTS)
    text = (f" Split on fixed in-memory batches, our compiled step takes {a['step']:.1f} ms against TorchRec's "
            f"{b['step']:.1f} ms; by part (ours against theirs, ms): "
            + "; ".join(f"{label[k]} {a[k]:.1f} against {b[k]:.1f}" for k in gaps) + ".")
    if "sparse_optimizer" in a:
        text += (f" Of our rest, the tables' Adagrad alone (per table on its unique rows: both slots gathered, "
                 f"updated and scattered back; inside the step the table's rows are the lookup's read) takes "
                 f"{a['sparse_optimizer']:.1f} ms.")
    return text


def _own_parts_text(r: dict, needed_ms: float, ours_ms: float) -> str:
    """Our step's parts against the step time a target needs (needed_ms; ours_ms: ours, all in), in words."""
    if not r.get("parts"):
        return ""
    a, label = r["parts"]["recpipe_ms"], dict(PARTS)
    keys = sorted((k for k, _ in PARTS if k in a and k not in ("step", "input")), key=lambda k: -a[k])
    dense = a["mlp"] + a["interaction"]
    text = (f" Split on fixed in-memory batches, our compiled step takes {a['step']:.1f} ms: "
            + "; ".join(f"{label[k]} {a[k]:.1f}" for k in keys) + ".")
    if "sparse_optimizer" in a:
        text += (f" The tables' Adagrad, timed alone, takes {a['sparse_optimizer']:.1f} ms; inside the step it "
                 f"overlaps other parts.")
    text += _step_kernels_text(r)
    outside = ours_ms - a["step"]
    where = (f" and {outside:.1f} ms outside it ({ours_ms:.1f} all in)" if outside >= 0 else
             f", and training, at many steps per call, takes {-outside:.1f} ms less per step than this step timed "
             f"one call per step ({ours_ms:.1f} all in: the call's dispatch, which the fixed batches pay at every "
             f"step)")
    return text + (f" The MLPs and the interaction, {dense:.1f} ms, are the same model in every contender. At the "
                   f"target's {needed_ms:.1f} ms per step they would leave {needed_ms - dense:.1f} ms for "
                   f"{r['spec'].get('tables', 26)} tables' lookups, their gradients, every Adagrad update, the input "
                   f"and the loop; ours spend {a['step'] - dense:.1f} ms in the compiled step{where}.")


def _rss_text(r: dict) -> str:
    """The training process's peak RSS against its state and the bound, in words."""
    source = r.get("memory_run") or r["runs"]
    peak, state = source["recpipe_train"]["peak_rss_mb"]["median"], r["state_mb"]
    when = ""
    if r.get("memory_run"):
        m = r["memory_run"]
        when = f"; measured alone on {m['machine'].get('date')}, {m['reps']} runs of {m['steps']} steps"
    return (f"the peak RSS of `recpipe train` ({peak:,.0f} MB{when}) against {PER_STATE} × its state "
            f"({state:,.0f} MB of "
            f"weights and Adagrad accumulators) + {BASE_MB:,.0f} MB = {bound_mb(state):,.0f} MB; above the state it "
            f"holds {peak - state:,.0f} MB: TensorFlow and its libraries (about 740 MB before the model is built), "
            f"the first step's trace and the input pipeline's buffers.")


def _ps_text(p: dict) -> str:
    """Each PS task's peak RSS against its bound, in words."""
    return "; ".join(f"{t}: peak {d['peak_rss_mb']:,.0f} MB against {PER_STATE} × {d['state_mb']:,.0f} MB of state + "
                     f"its base {d['base_rss_mb']:,.0f} MB = {PER_STATE * d['state_mb'] + d['base_rss_mb']:,.0f} MB"
                     for t, d in p["tasks"].items()) + "."


def explain(key: str, r: dict) -> Optional[str]:
    """Why an embedding-heavy target is where it is, from the run's own figures.

    Args:
        key: a ratio key.
        r: the suite's result.

    Returns:
        The explanation, or None for a key this suite does not report.
    """
    runs = r["runs"]
    if key == "train_rss_vs_bound" and "recpipe_train" in runs:
        return _rss_text(r)
    if key == "train_ps_task_rss_vs_bound" and r.get("ps_memory", {}).get("tasks"):
        return _ps_text(r["ps_memory"])
    if key not in SPEED_KEYS:
        return None
    peer = "tfrs_fit" if key.endswith("tfrs_fit") else "torchrec"
    if peer not in runs:
        return None
    ours, theirs = (runs[n]["examples_per_s"]["median"] for n in ("recpipe_train", peer))
    auc = [runs[n].get("eval_auc", {}).get("median", float("nan")) for n in ("recpipe_train", peer)]
    b = r["spec"]["batch_size"]
    text = (f"ours {ours:,.0f} ex/s ({1000 * b / ours:.1f} ms per step of {b}) against {theirs:,.0f} "
            f"({1000 * b / theirs:.1f} ms), eval AUC {auc[0]:.4f} against {auc[1]:.4f} after the same examples.")
    if peer == "torchrec":
        text += _parts_text(r)
    else:
        text += _own_parts_text(r, 1000 * b / theirs / TARGETS[key][1], 1000 * b / ours)
        text += (" Both look rows up with TensorFlow's gather. The peer's tf-keras Adagrad makes each table's "
                 "gradient unique again and updates it in five scatter, gather and arithmetic ops; ours looks each "
                 "distinct ID up once, updates those rows as whole tensors (the lookup's read and the accumulator's "
                 "rows, updated and scattered back), "
                 "traces its step without AutoGraph and runs 100 steps per call of it (train.tuning."
                 "steps_per_execution; the peer's fit calls its step once per step), and it pays for the shards' "
                 "input pipeline on the same 2 cores (the peer reads batches from memory). On fixed batches the "
                 "step is timed one call per step.")
    return text


def markdown(r: dict) -> str:
    """The suite's report.

    Args:
        r: bench_embedding's result (with "machine").

    Returns:
        Markdown.
    """
    runs, ratios, s, m = r["runs"], r["ratios"], r["spec"], r["machine"]
    what = {"recpipe_train": "`recpipe train` (shards, tf.data, ID dedup, row-block Adagrad)",
            "tfrs_fit": "TFRS tutorial: Keras Embedding per table, DotInteraction, data in memory, model.fit",
            "torchrec": "TorchRec DLRM: FusedEmbeddingBagCollection (FBGEMM TBE, fused "
                        f"{r['torchrec'].get('fused_optimizer', 'Adagrad')}), plain PyTorch loop, data in memory"}
    p = r["params"]
    lines = [f"# Embedding-heavy training ({sum(r['table_rows']):,} table rows, {s['log_rows']:,} log rows, "
             f"{r['steps']} steps of {s['batch_size']}, median of {r['reps']} round-robin runs, {m['cpus']} cores, "
             f"{m['cpu']}{', QUICK' if r['quick'] else ''})", "",
             f"DLRM: {s['tables']} hashed tables of {s['dim']} floats ({r['table_rows'][0]:,} to "
             f"{r['table_rows'][-1]:,} rows), bottom MLP {s['bottom_layers']}, top MLP {s['deep_layers']}, Adagrad "
             f"(lr {s['learning_rate']}) on everything, fp32, {s['threads']} threads for every contender. Embedding "
             f"parameters {p['recpipe']['embedding']:,} against {p['recpipe']['dense']:,} dense "
             f"({p['recpipe']['embedding_vs_dense']:,.0f}x; every contender's top MLP reads the dot products of "
             f"distinct features, as TorchRec and the TFRS default do). IDs Zipf-skewed (exponent "
             f"{s['exponent']}) over each table's rows. Training state (weights + Adagrad accumulators): "
             f"{r['state_mb']:,.0f} MB.", "",
             "| contender | what | ex/s (median) | min–max | eval AUC | peak RSS MB |", "|---|---|---|---|---|---|"]
    for name, run in runs.items():
        x, auc = run["examples_per_s"], run.get("eval_auc", {}).get("median", float("nan"))
        lines.append(f"| {name} | {what.get(name, '')} | {x['median']:,.0f} | {x['min']:,.0f}–{x['max']:,.0f} | "
                     f"{auc:.4f} | {run['peak_rss_mb']['median']:,.0f} |")
    lines += ["", "## Ratios", "", "| ratio | value |", "|---|---|",
              *[f"| {k} | {v:.3f} |" for k, v in sorted(ratios.items())], ""]
    if r["torchrec"]:
        t = r["torchrec"]
        lines += [f"TorchRec environment: {', '.join(f'{k} {v}' for k, v in t['versions'].items())}; created once "
                  f"in {t['env'].get('created_s')} s, {t['env'].get('size_mb'):,} MB (PyPI's torch 2.14 wheel "
                  f"brings its CUDA libraries).", ""]
    if r["parts"]:
        a, b = r["parts"]["recpipe_ms"], r["parts"]["torchrec_ms"]
        lines += ["## Where each step goes (ms per step, fixed in-memory batches, each part timed alone)", "",
                  "Each part runs alone, so each pays its own dispatch (TensorFlow's function call, PyTorch's "
                  "autograd start) that the whole step pays once: the parts need not add up to the step, and the "
                  "rest, the step minus the parts, can come out below zero.", "",
                  "| part | recpipe | TorchRec | recpipe / TorchRec |", "|---|---|---|---|",
                  *[f"| {label} | {a[k]:.1f} | {b[k]:.1f} | {f'{a[k] / b[k]:.2f}' if a[k] > 0 < b[k] else ''} |"
                    for k, label in PARTS if k in a and k in b], ""]
    for key in ("train_embedding_heavy_vs_tfrs_fit", "train_embedding_heavy_vs_torchrec"):
        if key in ratios:
            lines += [f"- **{key}** = {ratios[key]:.3f}: {explain(key, r)}"]
    rss = (r.get("memory_run") or runs)["recpipe_train"]["peak_rss_mb"]["median"]
    lines += [f"- **train_rss_vs_state** = {ratios['train_rss_vs_state']:.2f}: the peak RSS of `recpipe train` "
              f"({rss:,.0f} MB) against its state ({r['state_mb']:,.0f} MB of weights and Adagrad accumulators)."]
    if r.get("memory_run"):
        m = r["memory_run"]
        lines += [f"- The memory figures (train_rss_vs_state, train_rss_vs_bound, the PS tasks') come from a run of "
                  f"`recpipe train` alone on {m['machine'].get('date')} (commit "
                  f"{str(m['machine'].get('git_commit'))[:10]}; {m['reps']} runs of {m['steps']} steps, "
                  f"{m['recpipe_train']['examples_per_s']['median']:,.0f} ex/s, peak RSS "
                  + " / ".join(f"{v:,.0f}" for v in m["recpipe_train"]["peak_rss_mb"]["values"])
                  + " MB; `recpipe.bench.embedding.bench_memory`, merged by `merge_memory`); the contenders' table "
                  "and the speed ratios come from the full run above."]
    if "train_rss_vs_bound" in ratios:
        lines += [f"- **train_rss_vs_bound** = {ratios['train_rss_vs_bound']:.3f}: {_rss_text(r)}"]
    if r.get("ps_memory", {}).get("error"):
        lines += [f"- **train_ps_task_rss_vs_bound** not measured: the PS run failed: {r['ps_memory']['error']}"]
    elif r.get("ps_memory"):
        lines += [f"- **train_ps_task_rss_vs_bound** = {ratios['train_ps_task_rss_vs_bound']:.3f} (the largest over "
                  "the tasks): "
                  f"{_ps_text(r['ps_memory'])}", "", markdown_ps(r["ps_memory"])]
    lines += [""]
    lines += ["Reproduce: `.venv/bin/recpipe bench embedding` (`--quick` for the smoke run).", ""]
    return "\n".join(lines)
