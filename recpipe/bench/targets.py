"""The benchmark suites and the ratio targets every full run reports against (constants and pure functions
only: the CLI reads them before anything heavy is imported)."""

from __future__ import annotations

import math

__all__ = ["SUITES", "TARGETS", "RETIRED", "MEANINGS", "SUITE_OF", "suite_of", "meets"]

SUITES = ("preprocess", "train", "serve", "cluster", "quality", "export", "lifecycle", "embedding",
          "scaling")

# The ratio keys every full run carries, with their targets: (">=" | "<=", value).
TARGETS = {
    "preprocess_beam_vs_pyarrow": (">=", 0.5),
    "preprocess_rss_10x_vs_1x": ("<=", 1.5),
    "preprocess_beam_vs_duckdb": (">=", 0.8),
    "train_real_vs_synthetic_input": (">=", 0.95),
    "train_bf16_vs_fp32": (">=", 1.3),
    "train_horovod_scaling_2": (">=", 0.9),
    "train_ps_vs_local": (">=", 0.8),
    "train_default_roofline_fraction": (">=", 0.55),
    "serve_qps_vs_inprocess": (">=", 0.9),
    "serve_p99_ms_c8": ("<=", 10.0),
    "cluster_ps_prediction_error_1gbit": ("<=", 0.25),
    "cluster_ps_prediction_error_100mbit": ("<=", 0.25),
    "cluster_horovod_prediction_error_1gbit": ("<=", 0.25),
    "cluster_horovod_prediction_error_100mbit": ("<=", 0.25),
    "quality_criteo_margin_over_spread_vs_logistic": (">=", 1.0),
    "quality_criteo_margin_over_spread_vs_sklearn_lr": (">=", 1.0),
    "quality_movielens_margin_over_spread_vs_logistic": (">=", 1.0),
    "quality_movielens_margin_over_spread_vs_sklearn_lr": (">=", 1.0),
    "quality_criteo_auc_vs_lightgbm": (">=", 0.99),
    "quality_movielens_auc_vs_lightgbm": (">=", 0.99),
    "quality_instacart_recall10_vs_popularity": (">=", 1.5),
    "quality_movielens_retrieval_recall10_vs_popularity": (">=", 1.5),
    "quality_instacart_recall10_vs_ease": (">=", 0.95),
    "export_int8_bytes_vs_fp32": ("<=", 0.3),
    "export_int8_auc_delta_abs": ("<=", 0.002),
    "export_bf16_bytes_vs_fp32": ("<=", 0.55),
    "lifecycle_item_slots_vs_max_size": ("<=", 1.0),
    "lifecycle_auc_gap_vs_no_drift": ("<=", 0.01),
    "lifecycle_auc_gap_vs_no_lifecycle": ("<=", 0.01),
    "lifecycle_skew_checks_passed": (">=", 1.0),
    "train_embedding_heavy_vs_tfrs_fit": (">=", 1.5),
    "train_embedding_heavy_vs_torchrec": (">=", 1.0),
    "scaling_preprocess_rss_slope_direct": ("<=", 0.18),
    "train_rss_vs_bound": ("<=", 1.0),
    "train_ps_task_rss_vs_bound": ("<=", 1.0),
    "lifecycle_warm_day_rss_vs_bound": ("<=", 1.0),
}

# Ratios once held to a target, now reported as figures with the bound that retired them (measured in the
# same run and reported beside them): ratio -> why it has no target.
RETIRED = {
    "train_vs_tfrs_fit": "on the dense-heavy DCN-v2 the cross and deep layers alone take most of the peer's step, "
                         "so no implementation can lead it by much: the bound is `train_vs_tfrs_fit_dense_bound`",
    "train_horovod_np2_vs_two_independent": "two ranks share 2 cores with Gloo's collectives and Horovod's "
                                            "background thread, so the ceiling is the machine's, not the code's",
    "train_horovod_vs_plain_horovod": "on 2 shared cores both sides are bound by the same 2-process ceiling "
                                      "(`train_horovod_np2_vs_two_independent`'s denominator)",
}

# What each ratio compares, for the targets tables of the docs (every key of TARGETS and RETIRED has one).
MEANINGS = {
    "preprocess_beam_vs_pyarrow": "rows/s of the Beam job ÷ a single process running the same functions "
                                  "without Beam",
    "preprocess_rss_10x_vs_1x": "the Beam job's peak RSS at 10× the rows ÷ at 1×",
    "preprocess_beam_vs_duckdb": "rows/s of the Beam job on 2 cores (the fastest of multi_processing, "
                                 "multi_threading and a local Dask cluster, 2 workers each) ÷ DuckDB (2 threads) "
                                 "doing the same split, vocabularies and normalisation",
    "train_real_vs_synthetic_input": "ex/s on the real shards ÷ on one in-memory batch: how little the input "
                                     "pipeline costs",
    "train_bf16_vs_fp32": "ex/s in mixed bfloat16 ÷ in float32 (faster only on CPUs with AMX or AVX512-BF16)",
    "train_horovod_scaling_2": "ex/s of Horovod np=2 ÷ 2 × np=1, one thread per rank",
    "train_ps_vs_local": "ex/s of PS (2 workers × 1 thread + 2 PS tasks) ÷ local with the same 2 threads",
    "train_horovod_vs_plain_horovod": "ex/s of our Horovod path ÷ plain `horovod.tensorflow.keras` "
                                      "(DistributedOptimizer + fit, dense gradients), np=2",
    "train_horovod_np2_vs_two_independent": "ex/s of Horovod np=2 ÷ two independent np=1 runs at once (the "
                                            "host's own 2-process ceiling)",
    "train_vs_tfrs_fit": "ex/s of `recpipe train` ÷ the same DCN-v2 trained the TFRS-tutorial way (Keras "
                         "`fit`, data in memory)",
    "train_default_roofline_fraction": "the default DCN-v2's dense FLOP/s ÷ this CPU's measured matmul "
                                       "ceiling (float32)",
    "serve_qps_vs_inprocess": "REST queries/s with batching at concurrency 8 ÷ the same SavedModel called "
                              "in-process",
    "serve_p99_ms_c8": "REST p99 latency in ms at concurrency 8",
    "cluster_ps_prediction_error_1gbit": "|advisor's predicted PS step time − measured| ÷ measured, across "
                                         "network namespaces at 1 Gbit/s",
    "cluster_ps_prediction_error_100mbit": "the same at 100 Mbit/s",
    "cluster_horovod_prediction_error_1gbit": "the same for Horovod ring-allreduce at 1 Gbit/s",
    "cluster_horovod_prediction_error_100mbit": "the same for Horovod at 100 Mbit/s",
    "quality_criteo_margin_over_spread_vs_logistic": "the default's eval-AUC margin over our `logistic` "
                                                     "model ÷ the combined sd over seeds (≥ 1: it wins by "
                                                     "more than noise), Criteo sample",
    "quality_criteo_margin_over_spread_vs_sklearn_lr": "the same against scikit-learn `LogisticRegression` "
                                                       "with C chosen on validation, Criteo sample",
    "quality_movielens_margin_over_spread_vs_logistic": "the margin over `logistic` ÷ the spread, "
                                                        "MovieLens-100K ratings",
    "quality_movielens_margin_over_spread_vs_sklearn_lr": "the margin over scikit-learn LR ÷ the spread, "
                                                          "MovieLens-100K ratings",
    "quality_criteo_auc_vs_lightgbm": "the default's mean eval AUC ÷ LightGBM's (native categoricals, grid and "
                                      "early stopping on validation, same seeds), Criteo sample",
    "quality_movielens_auc_vs_lightgbm": "the same on MovieLens-100K ratings",
    "quality_instacart_recall10_vs_popularity": "two towers' recall@10 ÷ the most-popular baseline's, Instacart",
    "quality_movielens_retrieval_recall10_vs_popularity": "the same on MovieLens-100K",
    "quality_instacart_recall10_vs_ease": "two towers' recall@10 on candidates new to the user (seen removed) ÷ "
                                          "EASE's (closed-form item-item, λ on validation), Instacart's per-user "
                                          "leave-last-out split",
    "export_int8_bytes_vs_fp32": "SavedModel bytes with int8 stored weights ÷ float32",
    "export_int8_auc_delta_abs": "|eval AUC with int8 weights − float32|, the worse of Criteo and synthetic",
    "export_bf16_bytes_vs_fp32": "SavedModel bytes with bfloat16 stored weights ÷ float32",
    "lifecycle_item_slots_vs_max_size": "the daily DAG over drifting items, evicting: the item table's most "
                                        "slots on any day ÷ the vocabulary's max_size",
    "lifecycle_auc_gap_vs_no_drift": "the largest per-day |eval AUC gap| to the same DAG on a drift-free log",
    "lifecycle_auc_gap_vs_no_lifecycle": "the largest per-day |eval AUC gap| to the same log without admission "
                                         "or eviction (item table hashed): what the lifecycle costs",
    "lifecycle_skew_checks_passed": "the share of the days whose export passed its skew check",
    "train_embedding_heavy_vs_tfrs_fit": "ex/s of `recpipe train` ÷ the TFRS-tutorial way (Keras `Embedding` "
                                         "per table, DotInteraction, `fit`, data in memory) on an embedding-heavy "
                                         "DLRM (26 tables, 10.4M rows, Zipf-skewed IDs)",
    "train_embedding_heavy_vs_torchrec": "ex/s of `recpipe train` ÷ TorchRec's DLRM (FBGEMM's CPU kernels, fused "
                                         "Adagrad, a plain PyTorch loop, data in memory) on the same model and data",
    "scaling_preprocess_rss_slope_direct": "the exponent of the default job's peak RSS against the log's rows "
                                           "(least squares on log-log over 1M, 10M and 50M rows); 0.18 is "
                                           "`preprocess_rss_10x_vs_1x`'s 1.5x per tenfold rows",
    "train_rss_vs_bound": "peak RSS of `recpipe train` on the embedding-heavy DLRM ÷ (1.3 × its state, the weights "
                          "and Adagrad accumulators, + 800 MB)",
    "train_ps_task_rss_vs_bound": "the same DLRM on a local PS cluster (2 PS tasks, 1 worker): each PS task's peak RSS ÷ "
                            "(1.3 × the variables and accumulators placed on it + its RSS before any was), the "
                            "largest over the tasks",
    "lifecycle_warm_day_rss_vs_bound": "peak RSS of a warm-started day's `recpipe train` ÷ (1.3 × its tables' "
                                       "weights and Adagrad accumulators + 800 MB), the largest over the memory "
                                       "runs' warm-started days",
}

# The ratios whose key does not start with the name of the suite that measures them: key -> suite.
SUITE_OF = {"train_embedding_heavy_vs_tfrs_fit": "embedding", "train_embedding_heavy_vs_torchrec": "embedding",
            "train_rss_vs_bound": "embedding", "train_ps_task_rss_vs_bound": "embedding"}


def suite_of(key: str) -> str:
    """The suite that measures a ratio.

    Args:
        key: a ratio key.

    Returns:
        SUITE_OF's entry, else the key's first word.
    """
    return SUITE_OF.get(key, key.split("_", 1)[0])


def meets(key: str, value: float | None) -> bool:
    """Whether a ratio meets its target.

    Args:
        key: a key of TARGETS.
        value: the ratio; None or not finite (a null ratio of a saved run) never meets it.

    Returns:
        value >= or <= the target, as TARGETS says.

    Raises:
        KeyError: a key without a target.
    """
    op, target = TARGETS[key]
    if value is None or not math.isfinite(value):
        return False
    return value >= target if op == ">=" else value <= target
