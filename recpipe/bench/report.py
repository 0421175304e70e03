"""bench/results/REPORT.md and its PNG plots, from whatever suite results are in the folder: every
ratio against its target, every missed target explained from the run's own figures."""
from __future__ import annotations

import io
import os
import sys
from typing import Optional

import matplotlib.pyplot as plt

from recpipe.common import fsio
from recpipe.bench.targets import RETIRED, SUITES, TARGETS, meets, suite_of

__all__ = ["write_report"]


def _load_results(out_dir: str) -> dict:
    found = {}
    for suite in SUITES:
        path = os.path.join(out_dir, f"{suite}.json")
        if os.path.exists(path):
            found[suite] = fsio.read_json(path)
    return found


def _isa(machine: dict) -> str:
    """The best matmul instruction set of the CPU a suite ran on (results from before it was recorded: none)."""
    f = machine.get("cpu_features")
    if f is None:
        return ""
    return ", " + ("AMX" if "amx_bf16" in f else "AVX-512" if "avx512f" in f else "AVX2" if "avx2" in f else "no AVX2")


def _cpus_line(found: dict) -> str:
    """Which CPU each suite ran on, e.g. "CPU: Intel Xeon (preprocess, train), AMD EPYC (embedding)."

    Args:
        found: {suite: result}, each result's "machine" naming its "cpu" ("?" where it does not).

    Returns:
        One sentence, CPUs in the order their first suite appears in found.
    """
    suites: dict[str, list[str]] = {}
    for suite, r in found.items():
        suites.setdefault((r.get("machine") or {}).get("cpu") or "?", []).append(suite)
    return "CPU: " + ", ".join(f"{cpu} ({', '.join(names)})" for cpu, names in suites.items()) + "."


def _fmt(value: Optional[float]) -> str:
    """A ratio with four decimals below 1 (a gap of 0.0104 against a 0.01 target shows), three above."""
    if value is None:
        return "null"
    return f"{value:.4f}" if abs(value) < 1 else f"{value:.3f}"


NULL_RATIO = ("the run measured no finite value (NaN or infinite, written as null): the suite report shows the "
              "figures it came from.")
NULL_FIGURE = "see the suite report: a figure this explanation quotes is null (NaN or infinite in the run)."


def _explain(key: str, value: Optional[float], found: dict) -> str:
    """_why, for a ratio that is there; a null ratio, or a null figure its explanation quotes, says so."""
    if value is None:
        return NULL_RATIO
    try:
        return _why(key, found)
    except TypeError as e:  # formatting None: a NaN figure written as null
        if "NoneType" not in str(e):
            raise
        return NULL_FIGURE


def _machine_of(key: str, r: dict) -> dict:
    """The run that measured a ratio: a part measured again alone and merged into the suite's result (the
    embedding suite's memory_run, the lifecycle suite's memory_growth) names its own; else the suite's."""
    for part in ("memory_run", "memory_growth"):
        got = r.get(part) or {}
        if key in got.get("ratios", {}) and got.get("machine"):
            return got["machine"]
    return r.get("machine", {})


def write_report(out_dir: str) -> str:
    """bench/results/REPORT.md (+ PNG plots) from the suite results in out_dir. Each file is replaced whole
    (temp file + rename): runs of different suites writing into one folder at once never leave a torn one."""
    found = _load_results(out_dir)
    ratios: dict[str, Optional[float]] = {}
    for r in found.values():
        ratios.update(r.get("ratios", {}))
    plots = _plots(found, out_dir)
    any_r = next(iter(found.values()), {})
    m = any_r.get("machine", {})
    lines = ["# recpipe performance report", "",
             f"Machine: {m.get('cpus')} cores, {m.get('memory_gib')} GiB, Python "
             f"{m.get('python')}; " + ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items() if v) + ". "
             + _cpus_line(found),
             "Each suite's figures are medians of its repetitions (min–max in the suite reports); every ratio is "
             "against a baseline measured in the same run. The shared machine can land on hosts with different "
             "CPUs: each suite's row names the matmul instruction set it ran with (bf16 is only faster than fp32 "
             "with AMX or AVX512-BF16).", "",
             "| ratio | value | target | met | suite run |", "|---|---|---|---|---|"]
    for key, (op, target) in TARGETS.items():
        r = found.get(suite_of(key))
        if key in ratios:
            mark = "yes" if meets(key, ratios[key]) else "**no**: see below"
            m = _machine_of(key, r) if r else {}
            when = f"{m.get('date', '')}{' (quick)' if r.get('quick') else ''}{_isa(m)}" if r else ""
            lines.append(f"| {key} | {_fmt(ratios[key])} | {op} {target:g} | {mark} | {when} |")
        else:
            lines.append(f"| {key} | not run | {op} {target:g} | | |")
    missed = [k for k in TARGETS if k in ratios and not meets(k, ratios[k])]
    if missed:
        lines += ["", "## Targets missed, and why", ""]
        lines += [f"- **{k}** = {_fmt(ratios[k])}: {_explain(k, ratios[k], found)}" for k in missed]
    retired = [k for k in RETIRED if k in ratios]
    if retired:
        lines += ["", "## Reported without a target", ""]
        lines += [f"- **{k}** = {_fmt(ratios[k])} (no target: {RETIRED[k]}): {_explain(k, ratios[k], found)}"
                  for k in retired]
    other = {k: v for k, v in ratios.items() if k not in TARGETS and k not in RETIRED}
    if other:
        lines += ["", "## Other ratios", "", "| ratio | value |", "|---|---|",
                  *[f"| {k} | {_fmt(v)} |" for k, v in sorted(other.items())]]
    if plots:
        lines += ["", "## Plots", "", *[f"![{title}]({name})" for title, name in plots]]
    lines += ["", "Suite reports: " + ", ".join(f"[{s}.md]({s}.md)" for s in found), "",
              "Reproduce: `make bench` (all suites, over 2 hours on 2 cores) or `.venv/bin/recpipe bench SUITE`; "
              "`--quick` for the smoke run CI does.", ""]
    path = os.path.join(out_dir, "REPORT.md")
    fsio.replace_bytes(path, "\n".join(lines).encode("utf-8"))
    return path


def _per_day(run: list[dict], other: list[dict], key: str = "auc") -> list[float]:
    """Per day, `run`'s figure minus `other`'s (two runs of the lifecycle bench, day by day)."""
    return [a[key] - b[key] for a, b in zip(run, other)]


def _signed(values) -> str:
    return ", ".join(f"{v:+.4f}" for v in values)


def _train(found: dict):
    """The train suite's results, its runs, and the median ex/s of a run by name."""
    t = found.get("train", {})
    runs = t.get("runs", {})

    def med(name: str) -> float:
        return runs[name]["examples_per_s"]["median"]
    return t, runs, med


def _horovod_vs_plain(key: str, found: dict) -> Optional[str]:
    """train_horovod_vs_plain_horovod: ours and the plain Horovod peer per step, against two independent runs."""
    t, runs, med = _train(found)
    if not (key == "train_horovod_vs_plain_horovod" and "plain_horovod_np2" in runs):
        return None
    b = t["config"]["batch_size"]
    return (f"at np=2, one thread per rank, ours {med('horovod_np2'):,.0f} ex/s against "
            f"{med('plain_horovod_np2'):,.0f} for horovod.tensorflow.keras' DistributedOptimizer + fit on the "
            f"same model (dense gradients, data in memory), {1000 * 2 * b / med('horovod_np2'):.0f} against "
            f"{1000 * 2 * b / med('plain_horovod_np2'):.0f} ms per step. Two independent one-rank runs at once, "
            f"exchanging nothing, reach {med('independent_np1_x2'):,.0f} ex/s on this box: the most any np=2 "
            f"run can do here, {med('independent_np1_x2') / med('plain_horovod_np2'):.2f}x the peer."
            + (f" With our cycle time (horovodrun --cycle-time-ms) the peer made "
               f"{med('plain_horovod_np2_same_cycle'):,.0f} ex/s, and ours at Horovod's own 1 ms "
               f"{med('horovod_np2_cycle_1ms'):,.0f}." if "plain_horovod_np2_same_cycle" in runs else ""))


def _horovod_scaling(key: str, found: dict) -> Optional[str]:
    """train_horovod_scaling_2 / _np2_vs_two_independent: the bytes exchanged, and this box's 2-process ceiling."""
    t, runs, med = _train(found)
    if not (key in ("train_horovod_scaling_2", "train_horovod_np2_vs_two_independent") and "horovod_np2" in runs):
        return None
    b = t["config"]["batch_size"]
    one, two = 1000 * b / med("horovod_np1"), 1000 * 2 * b / med("horovod_np2")
    v = t["scale_out"]["validation"]
    x = t["scale_out"]["inputs"]
    split = v.get("horovod_bytes_2", {"allreduced": x["dense_params"] * 4, "allgathered": x["row_bytes_unique"]})
    text = (f"one rank steps in {one:.0f} ms, each of two ranks in {two:.0f} ms. The bytes exchanged per step "
            f"({split['allgathered'] / 2**20:.2f} MB of embedding rows allgathered, "
            f"{split['allreduced'] / 2**20:.1f} MB allreduced: dense gradients and any table sent whole) "
            f"take about "
            f"{(1 / v['horovod_scaling_2']['predicted'] - 1) * one:.1f} ms at loopback's measured "
            f"{v['loopback_gbps']:.0f} Gbit/s (the scale-out model predicts "
            f"{v['horovod_scaling_2']['predicted']:.2f}), "
            f"so bandwidth is not the loss.")
    if "independent_np1_x2" in runs:
        ceiling = med("independent_np1_x2") / (2 * med("horovod_np1"))
        text += (f" Two independent one-thread runs at once, exchanging nothing, reach {ceiling:.2f} of 2 x one "
                 f"run (this box's 2-process ceiling); Horovod np=2 reaches "
                 f"{med('horovod_np2') / med('independent_np1_x2'):.2f} of that. The rest is the CPU time of "
                 f"Gloo's collectives (the allgather of IndexedSlices and the dense allreduce, plus Horovod's "
                 f"background thread), which here runs on the same two cores as the two compute threads.")
    return text


def _ps_vs_local(key: str, found: dict) -> Optional[str]:
    """train_ps_vs_local: what a PS step does that a local one does not."""
    t, runs, med = _train(found)
    if not (key == "train_ps_vs_local" and "ps_2w_2ps" in runs):
        return None
    return (f"PS workers (1 thread each) reach {med('ps_2w_2ps'):,.0f} ex/s against {med('local_threads2'):,.0f} "
            f"for one local process with 2 threads. Each PS step is a ClusterCoordinator dispatch plus remote "
            f"reads and writes of every looked-up embedding row and every dense weight over gRPC, and five "
            f"processes (coordinator, 2 workers, 2 PS) share 2 cores, where the local step reads its tables "
            f"from its own memory. The scale-out model shows where PS wins (many workers, large tables).")


def _bf16_vs_fp32(key: str, found: dict) -> Optional[str]:
    """train_bf16_vs_fp32: the matmul ceilings, and whether the CPU has bf16 units."""
    t, runs, med = _train(found)
    c = t.get("ceiling_gflops", {})
    features = t.get("machine", {}).get("cpu_features")
    no_bf16_units = features is not None and not {"amx_bf16", "avx512_bf16"} & set(features)
    if not (key == "train_bf16_vs_fp32" and "dense_fp32" in runs):
        return None
    f = t["fraction_of_ceiling"]
    text = (f"the fp32 dense-heavy step already reaches {f['dense_fp32']:.0%} of the fp32 matmul ceiling "
            f"({c['fp32']['median']:,.0f} GFLOP/s), and bf16 matmuls are only "
            f"{c['bf16']['median'] / c['fp32']['median']:.2f}x faster here; the embedding lookups, casts, "
            f"optimizer updates (fp32 master weights) and input pipeline do not speed up.")
    if no_bf16_units:
        text += (" This run's CPU has neither AMX nor AVX512-BF16 (" + ", ".join(features) + "): oneDNN "
                 "converts bfloat16 to float32 around fp32 arithmetic, so bf16 cannot be faster on it.")
    return text


def _vs_tfrs_fit(key: str, found: dict) -> Optional[str]:
    """train_vs_tfrs_fit / train_default_roofline_fraction: the peer, the ceiling and the step's parts."""
    t, runs, med = _train(found)
    c = t.get("ceiling_gflops", {})
    features = t.get("machine", {}).get("cpu_features")
    no_bf16_units = features is not None and not {"amx_bf16", "avx512_bf16"} & set(features)
    if not (key in ("train_vs_tfrs_fit", "train_default_roofline_fraction") and "tfrs_fit_fp32" in runs):
        return None
    ours, peer, f = med("real_fp32"), med("tfrs_fit_fp32"), t["fraction_of_ceiling"]["real_fp32"]
    auc = [runs[n].get("eval_auc", {}).get("median", float("nan")) for n in ("real_fp32", "tfrs_fit_fp32")]
    head = (f"ours {ours:,.0f} ex/s against {peer:,.0f} for the same DCN-v2 trained the TFRS-tutorial way "
            f"(Keras Embeddings, data in memory, model.fit), eval AUC {auc[0]:.4f} against {auc[1]:.4f} after "
            f"the same {t['steps']} steps. ")
    if key == "train_default_roofline_fraction":
        share = t["step_parts"]["parts_share"]
        return head + (f"The default's dense matmuls reach {f:.0%} of the fp32 matmul ceiling "
                       f"({c['fp32']['median']:,.0f} GFLOP/s). By ablation of the compiled step on in-memory "
                       f"batches, the cross layers take {share['cross_layers']:.0%} of it, the deep layers "
                       f"{share['deep_layers']:.0%}, and the embedding lookups, loss and sparse Adagrad updates "
                       f"{share['embeddings_loss_optimizer']:.0%}: those are memory-bound gathers and "
                       f"scatters, which no matmul unit speeds up.")
    if "real_bf16" in runs and "tfrs_fit_bf16" in runs:
        faster = "bf16" if med("tfrs_fit_bf16") >= peer else "fp32"
        head += (f"In bf16 ours makes {med('real_bf16'):,.0f} ex/s against the peer's {med('tfrs_fit_bf16'):,.0f} "
                 f"({med('real_bf16') / med('tfrs_fit_bf16'):.2f}x; the peer's faster precision here is "
                 f"{faster}): " + ("this CPU has no bf16 units (neither AMX nor AVX512-BF16), so neither gains "
                                   "from bf16. " if no_bf16_units else
                                   "TFRS 0.7.7's Cross layer computes in float32 under mixed_bfloat16, which the "
                                   "peer keeps and ours (recpipe.trainers.layers.Cross) does not. "))
    p = t["step_parts"]
    ms, bound = p["step_ms"], p["bound_vs_peer"]
    return head + (f"Timed round-robin in one process on in-memory batches, the peer's compiled step takes "
                   f"{ms['peer']:.1f} ms and the model's cross and deep layers alone, forward and backward on "
                   f"the model's own input with no lookups, optimizer or input, {ms['dense_layers']:.1f} ms "
                   f"(ours {ms['full']:.1f}): every implementation of this model computes at least those, so "
                   f"with every other cost at zero ours would reach {bound:.2f}x the peer. "
                   + ("The lead has to come from the embedding lookups, their sparse updates and the input, "
                      "where both still spend the same time."
                      if key in TARGETS and bound >= TARGETS[key][1] else ""))


def _cluster_prediction(key: str, found: dict) -> Optional[str]:
    """cluster_*_prediction_error_*: the measured step against the calibrated prediction."""
    if not (key.startswith("cluster_") and "cluster" in found):
        return None
    strategy, link = key[len("cluster_"):].split("_prediction_error_")
    p = found["cluster"]["predictions"][f"{strategy}_{link}"]
    cal = found["cluster"]["calibration"]
    over = cal["overheads"]["ps_s" if strategy == "ps" else "allreduce_s"] + cal["compute_probe_s"]
    return (f"measured {p['measured_step_s'] * 1000:,.0f} ms per step at {link}, predicted "
            f"{p['calibrated_s'] * 1000:,.0f} ms = {over * 1000:,.0f} ms measured on the unshaped link + "
            f"{p['bytes_only_s'] * 1000:,.0f} ms of bytes over this link's goodput. A measured step shorter than "
            f"that means communication overlapped computation (Horovod starts allreducing gradients while the "
            f"backward pass still runs), which the model does not credit; longer, that the link's queueing or "
            f"the CPU the transfers take grew with the slower link.")


def _beam_vs_duckdb(key: str, found: dict) -> Optional[str]:
    """preprocess_beam_vs_duckdb: what the Beam job does that DuckDB does not."""
    peers = found.get("preprocess", {}).get("peers")
    if not (key == "preprocess_beam_vs_duckdb" and peers):
        return None
    if peers.get("why"):  # the suite's own account, from the run's figures (recpipe.bench.preprocess.peers_why)
        return peers["why"]
    w = peers["wall_s"]
    return (f"on {peers['rows']:,} rows `recpipe preprocess` takes {w['beam']['median']:.1f} s and DuckDB "
            f"{w['duckdb']['median']:.1f} s. Both count vocabularies with vectorised group-bys now (Arrow count "
            f"tables merged whole) and look IDs up vectorised (Arrow's index_in); what remains on our side is "
            f"fixed cost (importing TensorFlow and Beam and building the pipeline take about 10 s of it), two "
            f"reads and validations of the log (analysis, then transform: memory stays bounded as the log "
            f"grows), TensorFlow's FarmHash for the OOV tokens, and encoding the record batches. DuckDB runs "
            f"everything in C++ on both cores; the DirectRunner runs one Python thread.")


def _quality_margin(key: str, found: dict) -> Optional[str]:
    """quality_*_margin_over_spread_vs_*: the default's AUC per seed against the baseline's."""
    ranking = found.get("quality", {}).get("ranking", {})
    log, _, peer = key[len("quality_"):].partition("_margin_over_spread_vs_")
    if not (peer and log in ranking):
        return None
    models = ranking[log]
    b = models["sklearn_logistic" if peer == "sklearn_lr" else peer]
    d = models["default"]
    aucs = ", ".join(f"{r['auc']:.4f}" for r in d["runs"])
    behind = sum(r["auc"] < b["auc_mean"] for r in d["runs"])
    return (f"the default's eval AUC per seed is {aucs} (mean {d['auc_mean']:.4f} ± {d['auc_sd']:.4f}) against "
            f"{b['auc_mean']:.4f} ± {b['auc_sd']:.4f} for the baseline: a margin of "
            f"{d['auc_mean'] - b['auc_mean']:+.4f} on the mean, smaller than the seeds' spread, and {behind} of "
            f"the {len(d['runs'])} seeds below the baseline.")


def kept_types(model: dict) -> str:
    """The model types a retrieval summary's seeds kept, e.g. "item_to_item" or "two_tower 2, item_to_item 1".

    Args:
        model: a retrieval log's "model" summary (its runs' "kept").

    Returns:
        The types, with their counts when the seeds differ.
    """
    kept = [r.get("kept") or "?" for r in model["runs"]]
    counts = {k: kept.count(k) for k in dict.fromkeys(kept)}
    return next(iter(counts)) if len(counts) == 1 else ", ".join(f"{k} {n}" for k, n in counts.items())


def _retrieval_vs_popularity(key: str, found: dict) -> Optional[str]:
    """quality_*_recall10_vs_popularity: the config's model, popularity and co-occurrence on the same clicks."""
    retrieval = found.get("quality", {}).get("retrieval", {})
    name = key[len("quality_"):-len("_recall10_vs_popularity")] if key.endswith("_recall10_vs_popularity") else ""
    if not (name in retrieval):
        return None
    r = retrieval[name]
    t = r["model"]
    who = f"the config's model ({kept_types(t)})"
    logged = "history_cooccurrence" in r  # the config's query tower reads a logged history
    return (f"{who} reaches recall@10 {t['recall_at_10_mean']:.4f} ± {t['recall_at_10_sd']:.4f}, popularity "
            f"{r['most_popular']['recall_at_10']:.4f} and co-occurrence {r['cooccurrence']['recall_at_10']:.4f} "
            + (f"(over the row's logged history {r['history_cooccurrence']['recall_at_10']:.4f}) "
               if logged else "")
            + f"on the same {r['examples']:,} eval clicks; on the {r['new_examples']:,} clicks of candidates new "
            f"to the user, {t['new_recall_at_10_mean']:.4f} against {r['most_popular']['new_recall_at_10']:.4f}. "
            + (f"Only {r['history_examples']:,} of the {r['examples']:,} eval clicks come from users who clicked "
               f"anything before the eval split; the rest are users new to the model, whom the query tower knows "
               f"by their attributes{' and logged history' if logged else ' alone'}."
               + (f" On the users with history, it reaches "
                  f"{t['history_recall_at_10_mean']:.4f} ± {t['history_recall_at_10_sd']:.4f} against "
                  f"popularity's {r['most_popular']['history_recall_at_10']:.4f} and co-occurrence's "
                  f"{r['cooccurrence']['history_recall_at_10']:.4f}."
                  if r["history_examples"] else "")  # none: their recall is NaN, null in the JSON
               if "history_examples" in r else
               "Where the eval clicks are new items of the moment (a time split) rather than repeats, what the "
               "query tower learns from a user's history does not beat what is popular now."))


def _quality_entry(found: dict, part: str, key: str, middle: str, needs: str) -> Optional[dict]:
    """The quality suite's entry for the log a ratio key quality_LOG_MIDDLE names, in found["quality"][part],
    when it holds `needs` (else None)."""
    head, tail = "quality_", f"_{middle}"
    entries = found.get("quality", {}).get(part, {})
    name = key[len(head):-len(tail)] if key.startswith(head) and key.endswith(tail) else ""
    return entries[name] if name in entries and needs in entries[name] else None


def _per_seed(runs: list[dict], field: str) -> str:
    return ", ".join(f"{r[field]:.4f}" for r in runs)


def _auc_vs_lightgbm(key: str, found: dict) -> Optional[str]:
    """quality_*_auc_vs_lightgbm: the default's AUC per seed against LightGBM's, on eval and on validation."""
    models = _quality_entry(found, "ranking", key, "auc_vs_lightgbm", "lightgbm")
    if models is None:
        return None
    d, g = models["default"], models["lightgbm"]
    chosen = ", ".join(f"{k} {v:g}" for k, v in g["params"].items())
    return (f"the default's eval AUC per seed is {_per_seed(d['runs'], 'auc')} (mean {d['auc_mean']:.4f} ± "
            f"{d['auc_sd']:.4f}) against LightGBM's {_per_seed(g['runs'], 'auc')} (mean {g['auc_mean']:.4f} ± "
            f"{g['auc_sd']:.4f}; {chosen}, chosen on validation): a gap of {g['auc_mean'] - d['auc_mean']:+.4f} in "
            f"LightGBM's favour. On validation the default's best checkpoints reached "
            f"{_per_seed(d['runs'], 'validation_auc')} and LightGBM {_per_seed(g['runs'], 'validation_auc')}.")


def _recall_vs_ease(key: str, found: dict) -> Optional[str]:
    """quality_*_recall10_vs_ease: the config's model's seen-excluded recall per seed against EASE's and the
    others'."""
    r = _quality_entry(found, "retrieval", key, "recall10_vs_ease", "ease")
    if r is None:
        return None
    t, e = r["model"], r["ease"]
    als = (f"ALS's {r['als']['new_recall_at_10_mean']:.4f} ± {r['als']['new_recall_at_10_sd']:.4f}, "
           if "als" in r else "")
    return (f"on the {r['new_examples']:,} eval clicks of candidates new to the user (the user's earlier ones "
            f"removed), the config's model ({kept_types(t)}) reaches recall@10 "
            f"{_per_seed(t['runs'], 'new_recall_at_10')} per seed (mean "
            f"{t['new_recall_at_10_mean']:.4f} ± {t['new_recall_at_10_sd']:.4f}) against EASE's "
            f"{e['new_recall_at_10']:.4f} (λ {e['lambda']:g}, chosen on validation, where it reached "
            f"{e['validation_new_recall_at_10']:.4f}), {als}co-occurrence's "
            f"{r['cooccurrence']['new_recall_at_10']:.4f} and "
            f"popularity's {r['most_popular']['new_recall_at_10']:.4f}. Counting repeats (plain recall@10), it "
            f"reaches {t['recall_at_10_mean']:.4f} and EASE {e['recall_at_10']:.4f}"
            + (": the towers learn in each user's ID embedding what that user clicked before, and rank it first, "
               "but score a candidate new to the user only through that embedding, where EASE scores it from the "
               "candidates clicked together with the user's own." if kept_types(t) == "two_tower" else "."))


def _export_bytes(key: str, found: dict) -> Optional[str]:
    """export_*_bytes_vs_fp32: what the weight dtype shrinks and what it cannot."""
    logs = found.get("export", {}).get("logs", {})
    if not (key.startswith("export_") and key.endswith("_bytes_vs_fp32") and logs):
        return None
    option = "int8" if "int8" in key else "bfloat16"
    parts = []
    for name, r in logs.items():
        f, o = r["float32"], r[option]
        rest_f, rest_o = (f["bytes"] - f["weight_bytes"]) / 1e6, (o["bytes"] - o["weight_bytes"]) / 1e6
        parts.append(f"{name}: {f['bytes'] / 1e6:.2f} → {o['bytes'] / 1e6:.2f} MB, of which the weights "
                     f"{f['weight_bytes'] / 1e6:.2f} → {o['weight_bytes'] / 1e6:.2f} MB "
                     f"({o['weight_bytes'] / f['weight_bytes']:.2f}×) and the rest (graph, vocabularies) "
                     f"{rest_f:.2f} → {rest_o:.2f} MB")
    return ("the weights shrink as stored (int8: 1 byte per value + a one-byte power-of-two scale per row, "
            "17/64 of float32 for 16-wide rows; bfloat16: half), but these models are small and the SavedModel's "
            "graph and vocabulary constants, which no weight dtype shrinks, are a large share of the folder: "
            + "; ".join(parts) + ". The share falls as tables grow.")


def _lifecycle_gap(key: str, found: dict) -> Optional[str]:
    """lifecycle_auc_gap_vs_no_drift: the per-day gaps, their noise, and the runs that tell causes apart."""
    life = found.get("lifecycle", {}).get("runs", {})
    if not (key == "lifecycle_auc_gap_vs_no_drift" and life):
        return None
    gaps = _per_day(life["drift_evict"], life["stable_evict"])
    text = "per day, drifting − drift-free eval AUC: " + _signed(gaps) + ". "
    if all("auc_se" in d for d in life["drift_evict"] + life["stable_evict"]):
        se = [(a["auc_se"] ** 2 + b["auc_se"] ** 2) ** 0.5
              for a, b in zip(life["stable_evict"], life["drift_evict"])]
        noise = max(abs(g) / x for g, x in zip(gaps, se))
        text += (f"Each day's AUC is measured on about {life['drift_evict'][-1]['eval_examples']:,} eval rows, so "
                 f"the difference of two runs' AUCs has a standard error (Hanley & McNeil) of "
                 + ", ".join(f"{x:.4f}" for x in se) + " per day: a 0.01 band is about "
                 f"{0.01 / max(se):.1f} of those, and the largest gap {noise:.1f} of its day's"
                 + (", within measurement noise. " if noise < 2 else ": more than measurement noise. "))
    if "drift_no_evict" in life:
        keep = _per_day(life["drift_evict"], life["drift_no_evict"])
        text += ("The same DAG without eviction on the same drifting log differs from the evicting one by "
                 + _signed(keep) + ": eviction and slot reuse cost nothing measurable. ")
    if all("oracle_auc" in d for d in life["drift_evict"] + life["stable_evict"]):
        drift, stable = life["drift_evict"], life["stable_evict"]
        truth = _per_day(drift, stable, "oracle_auc")
        text += ("The hidden model itself, scoring the same eval rows with the probabilities their labels were "
                 "drawn with, differs between the two logs by " + _signed(truth)
                 + " per day, so the runs' gap beyond the logs' own difference is "
                 + _signed(g - t for g, t in zip(gaps, truth))
                 + " (lifecycle_auc_gap_beyond_oracle). ")
    if "drift_hashed" in life:
        free = _per_day(life["drift_evict"], life["drift_hashed"])
        text += ("The drifting log with no lifecycle at all (item table hashed: every item has a row from its "
                 "first click, nothing admitted or evicted) differs from the evicting run by "
                 + _signed(free) + " (lifecycle_auc_gap_vs_no_lifecycle)")
        if max(map(abs, free)) <= max(map(abs, gaps)) / 2:
            text += (", so most of the gap to the drift-free log is the drifting log's own, which any model of "
                     "it pays: each day's model meets items it has little or no history of, where the "
                     "drift-free run has seen the same items every day. The hidden model, knowing every "
                     "item's weights, does not pay it. ")
        else:
            text += f": the lifecycle itself costs up to {max(map(abs, free)):.4f}. "
    if "drift_evict_lifelong" in life and "stable_evict_lifelong" in life:
        settings = found["lifecycle"]["settings"]
        lifelong = _per_day(life["drift_evict_lifelong"], life["stable_evict_lifelong"])
        text += ("In this drifting log the items that stop each day are its most clicked (Zipf-ranked from the "
                 "window's start). On a second pair of logs whose items keep one popularity from their first "
                 "day to their last, so that the items that stop take a random share of the clicks, the same "
                 "two runs differ by " + _signed(lifelong) + " per day (lifecycle_auc_gap_vs_no_drift_lifelong)")
        if max(map(abs, lifelong)) >= max(map(abs, gaps)) / 2:
            text += (f": about as much, so the gap comes with the churn itself (every item lives "
                     f"{settings['items_per_day'] / settings['item_drift']:.0f} days), not with which items stop.")
        else:
            text += ": which items stop matters more than how many."
    return text.strip()


def _serve_p99(key: str, found: dict) -> Optional[str]:
    """serve_p99_ms_c8: where a request's time goes."""
    serve = found.get("serve", {})
    if not (key == "serve_p99_ms_c8" and serve.get("batching_on", {}).get("8", {}).get("breakdown_ms")):
        return None
    b, inproc = serve["batching_on"]["8"]["breakdown_ms"], serve["in_process"]["8"]
    return (f"at concurrency 8 with batching, a request's mean {b['client']:.1f} ms is transport "
            f"{b['transport']:.1f} ms (HTTP on both sides, the server's event loop, the load generator's threads) "
            f"and {b['server']:.1f} ms in the server: model call {b['model']:.1f}, waiting for a batch "
            f"{b['queue']:.1f}, "
            f"thread handoff {b['handoff']:.1f}, JSON parse {b['parse']:.2f}, validation {b['validate']:.2f}. "
            f"The server, its Python threads and the load generator share 2 cores: the same SavedModel called "
            f"in-process by 8 threads has a p99 of {inproc['p99_ms']:.1f} ms on this machine today.")


def _serve_qps(key: str, found: dict) -> Optional[str]:
    """serve_qps_vs_inprocess: what the server adds to an in-process call."""
    serve = found.get("serve", {})
    if not (key == "serve_qps_vs_inprocess" and serve.get("batching_on", {}).get("8", {}).get("breakdown_ms")):
        return None
    b, on, off = serve["batching_on"]["8"]["breakdown_ms"], serve["batching_on"]["8"], serve["batching_off"]["8"]
    inproc = serve["in_process"]["8"]
    return (f"at concurrency 8 the server answers {on['qps']:,.0f} QPS with batching ({off['qps']:,.0f} without) "
            f"where 8 threads calling the signature in-process with ready-made tensors reach {inproc['qps']:,.0f}. "
            f"Per request the server adds what the in-process call skips: HTTP and the event loop's turns "
            f"(transport {b['transport']:.1f} ms, shared with the load generator's threads), JSON parse "
            f"{b['parse']:.2f}, validation {b['validate']:.2f}, building the input tensors, the batch wait "
            f"{b['queue']:.1f} and "
            f"the thread handoff {b['handoff']:.1f} ms, all Python on the same 2 cores as the model: the "
            f"cheaper the model call, the larger that fixed share.")


def _real_vs_synthetic(key: str, found: dict) -> Optional[str]:
    """train_real_vs_synthetic_input: the input path shares the cores."""
    if key != "train_real_vs_synthetic_input" or "real_fp32" not in found.get("train", {}).get("runs", {}):
        return None
    return ("parsing and re-batching the shards runs on the same 2 cores as the training step, so the real "
            "input path takes CPU time the synthetic in-memory batch does not.")


def _embedding_heavy(key: str, found: dict) -> Optional[str]:
    """train_embedding_heavy_*: the contenders' rates and AUCs, and the parts of both steps."""
    from recpipe.bench.embedding import explain
    return explain(key, found["embedding"]) if "embedding" in found else None


def _scaling(key: str, found: dict) -> Optional[str]:
    """scaling_*: the points the slope was fitted on."""
    from recpipe.bench.scaling_report import explain
    return explain(key, found["scaling"]) if "scaling" in found else None


def _warm_day_memory(key: str, found: dict) -> Optional[str]:
    """lifecycle_warm_day_rss_vs_bound: the worst warm-started day's peak RSS against its bound."""
    memory = found.get("lifecycle", {}).get("memory_growth")
    if key != "lifecycle_warm_day_rss_vs_bound" or not memory:
        return None
    from recpipe.bench.lifecycle_memory import warm_day_text
    return warm_day_text(memory)


# Each explains the keys it knows from what the same run measured, or returns None.
_EXPLANATIONS = (_horovod_vs_plain, _horovod_scaling, _ps_vs_local, _bf16_vs_fp32, _vs_tfrs_fit, _cluster_prediction,
                 _beam_vs_duckdb, _quality_margin, _retrieval_vs_popularity, _auc_vs_lightgbm, _recall_vs_ease,
                 _export_bytes, _lifecycle_gap, _serve_p99, _serve_qps, _real_vs_synthetic, _embedding_heavy,
                 _scaling, _warm_day_memory)


def _why(key: str, found: dict) -> str:
    """Why a target is missed on this machine, from what the same run measured."""
    for explain in _EXPLANATIONS:
        text = explain(key, found)
        if text is not None:
            return text
    return "see the suite report."


def _num(value: Optional[float]) -> float:
    """A plotted figure: null (NaN or infinite in the run) as NaN, which matplotlib leaves out; it refuses None."""
    return float("nan") if value is None else value


def _plots(found: dict, out_dir: str) -> list[tuple[str, str]]:
    plt.switch_backend("Agg")  # files only, no display
    made = []

    def label(ax, xlabel: str, ylabel: str, title: str, legend_size: float = 9) -> None:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=legend_size)

    def save(fig, name: str, title: str) -> None:
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=90)
        fsio.replace_bytes(os.path.join(out_dir, name), png.getvalue())  # whole, whoever else writes the folder
        plt.close(fig)
        made.append((title, name))

    if "preprocess" in found:
        p = found["preprocess"]["preprocess"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for job in ("beam", "baseline"):
            keys = sorted((k for k in p["rows_per_s"] if k.startswith(job)), key=lambda k: int(k.split("_")[1][:-1]))
            xs = [p["rows"] * int(k.split("_")[1][:-1]) for k in keys]
            m, lo, hi = ([_num(p["rows_per_s"][k][q]) for k in keys] for q in ("median", "min", "max"))
            ax.errorbar(xs, m, marker="o", yerr=[[a - b for a, b in zip(m, lo)], [b - a for a, b in zip(m, hi)]],
                        label={"beam": "Beam DirectRunner", "baseline": "single process, no Beam"}[job])
        ax.set_xscale("log")
        label(ax, "rows", "rows/s", "Preprocessing throughput vs rows")
        save(fig, "preprocess_throughput.png", "preprocess throughput vs rows")
    if "train" in found:
        t = found["train"]
        names = [n for n in t["runs"] if not n.startswith(("rss_", "data_", "criteo_"))]
        med, lo, hi = ([_num(t["runs"][n]["examples_per_s"][q]) for n in names] for q in ("median", "min", "max"))
        lo, hi = [m - v for m, v in zip(med, lo)], [v - m for m, v in zip(med, hi)]
        fig, ax = plt.subplots(figsize=(8, 0.3 * len(names) + 1.5))
        ax.barh(names, med, xerr=[lo, hi], color="tab:blue")
        ax.invert_yaxis()
        ax.set_xlabel("examples/s (median, min–max)")
        ax.set_title("Training throughput per precision / strategy / knob")
        save(fig, "train_throughput.png", "training ex/s per precision, strategy and knob")
        rss = t.get("rss_vs_table") or {}
        if rss.get("table_rows"):
            fig, ax = plt.subplots(figsize=(6, 3.5))
            peak, table = [_num(v) for v in rss["peak_rss_mb"]], [_num(v) for v in rss["table_mb"]]
            ax.plot(rss["table_rows"], peak, marker="o", label="peak RSS")
            ax.plot(rss["table_rows"], [peak[0] - table[0] + mb for mb in table],
                    linestyle="--", label="first point + table and Adagrad bytes")
            if "data_4x_peak_rss_mb" in rss:
                ax.scatter([rss["table_rows"][0]], [_num(rss["data_4x_peak_rss_mb"])], color="tab:red", zorder=3,
                           label="4x the data, smallest table")
            label(ax, "embedding-table rows", "MB", "Peak RSS vs embedding-table size")
            save(fig, "train_rss_vs_table.png", "peak RSS vs embedding-table size")
    if "serve" in found:
        s = found["serve"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for mode, color in (("in_process", "tab:gray"), ("batching_off", "tab:orange"), ("batching_on", "tab:blue")):
            cs = sorted(s[mode], key=int)
            for pct, style in (("p50_ms", ":"), ("p99_ms", "-")):
                ax.plot([int(c) for c in cs], [_num(s[mode][c][pct]) for c in cs], style, marker="o", color=color,
                        label=f"{mode} {pct[:3]}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        label(ax, "concurrent clients", "latency ms", "Serving latency percentiles vs concurrency", 7)
        save(fig, "serve_latency.png", "serving latency percentiles vs concurrency")
    if "lifecycle" in found:
        life = found["lifecycle"]
        fig, (slots, auc) = plt.subplots(1, 2, figsize=(9, 3.5))
        for i, (name, days) in enumerate(life["runs"].items()):
            x, color = list(range(1, len(days) + 1)), f"C{i}"  # a run's colour is the same in both panels
            if days[0]["item_slots"] is not None:  # a hashed item table has no slots
                slots.plot(x, [_num(d["item_slots"]) for d in days], marker="o", label=name, color=color)
            auc.plot(x, [_num(d["auc"]) for d in days], marker="o", label=name, color=color)
        slots.axhline(life["settings"]["max_size"], color="gray", linestyle=":", label="max_size")
        label(slots, "day", "item table slots", "Item table size per day", 7)
        label(auc, "day", "eval AUC", "Eval AUC per day", 7)
        save(fig, "lifecycle.png", "item table size and eval AUC per day, drifting items")
        memory = life.get("memory_growth")
        if memory:
            fig, (tables, rss) = plt.subplots(1, 2, figsize=(9, 3.5))
            for name, days in memory["runs"].items():
                x = list(range(1, len(days) + 1))
                tables.plot(x, [_num(d["table_mb"]) for d in days], marker="o", label=name)
                rss.plot(x, [_num(d["train_peak_rss_mb"]) for d in days], marker="o", label=name)
            label(tables, "day", "MB", "Embedding tables + Adagrad state", 7)
            label(rss, "day", "MB", "Peak trainer RSS", 7)
            save(fig, "lifecycle_memory.png", "table size and peak trainer RSS per day, with and without eviction")
    if "scaling" in found:
        from recpipe.bench.scaling_report import PNG, write_png
        write_png(found["scaling"], out_dir)
        made.append(("time and peak RSS against log rows and table rows, log-log", PNG))
    return made


if __name__ == "__main__":  # python -m recpipe.bench.report OUT_DIR: rewrite REPORT.md from existing results
    print(write_report(sys.argv[1] if len(sys.argv) > 1 else "bench/results"))
