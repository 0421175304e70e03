"""The benchmark suites and the ratio targets every full run reports against (constants only:
the CLI reads them before anything heavy is imported)."""

__all__ = ["SUITES", "TARGETS"]

SUITES = ("preprocess", "train", "serve", "cluster", "quality", "export", "lifecycle")

# The ratio keys every full run carries, with their targets: (">=" | "<=", value).
TARGETS = {
    "preprocess_beam_vs_pyarrow": (">=", 0.5),
    "preprocess_rss_10x_vs_1x": ("<=", 1.5),
    "preprocess_beam_vs_duckdb": (">=", 0.5),  # the same transform done by DuckDB, 2 threads
    "train_real_vs_synthetic_input": (">=", 0.95),
    "train_bf16_vs_fp32": (">=", 1.3),
    "train_horovod_scaling_2": (">=", 0.9),
    "train_ps_vs_local": (">=", 0.8),
    # issue 16: our Horovod path against plain horovod.tensorflow.keras (DistributedOptimizer + fit, dense
    # gradients) at np=2, and against this box's own 2-process ceiling (two independent one-rank runs at once)
    "train_horovod_vs_plain_horovod": (">=", 1.2),
    "train_horovod_np2_vs_two_independent": (">=", 0.8),
    # issue 16: our `recpipe train` against the same DCN-v2 trained the TFRS-tutorial way (model.fit, data in memory)
    "train_vs_tfrs_fit": (">=", 1.5),
    # the default DCN-v2's dense FLOP/s over this CPU's measured matmul ceiling (fp32)
    "train_default_roofline_fraction": (">=", 0.55),
    # issue 16: REST with batching at concurrency 8 against the same SavedModel called in-process
    "serve_qps_vs_inprocess": (">=", 0.9),
    "serve_p99_ms_c8": ("<=", 10.0),
    # the advisor's calibrated step-time prediction vs measurement across hosts (bench cluster)
    "cluster_ps_prediction_error_1gbit": ("<=", 0.25),
    "cluster_ps_prediction_error_100mbit": ("<=", 0.25),
    "cluster_horovod_prediction_error_1gbit": ("<=", 0.25),
    "cluster_horovod_prediction_error_100mbit": ("<=", 0.25),
    # the shipped ranking default's eval AUC margin over a baseline, in units of the run-to-run spread
    "quality_criteo_margin_over_spread_vs_logistic": (">=", 1.0),
    "quality_criteo_margin_over_spread_vs_sklearn_lr": (">=", 1.0),
    "quality_movielens_margin_over_spread_vs_logistic": (">=", 1.0),
    "quality_movielens_margin_over_spread_vs_sklearn_lr": (">=", 1.0),
    # retrieval: recall@10 of the shipped two towers over the most-popular baseline's, on real logs
    "quality_instacart_recall10_vs_popularity": (">=", 2.0),
    "quality_movielens_retrieval_recall10_vs_popularity": (">=", 2.0),
    # exported SavedModel bytes and eval AUC with int8 / bfloat16 stored weights, the worse of Criteo and synthetic
    "export_int8_bytes_vs_fp32": ("<=", 0.3),
    "export_int8_auc_delta_abs": ("<=", 0.002),
    "export_bf16_bytes_vs_fp32": ("<=", 0.55),
    # the daily DAG over drifting items, evicting: the item table stays within max_size, the eval AUC
    # within 0.01 of the same DAG on a drift-free log, and every day's export passes its skew check
    "lifecycle_item_slots_vs_max_size": ("<=", 1.0),
    "lifecycle_auc_gap_vs_no_drift": ("<=", 0.01),
    # ... and within 0.01 of the same log's run without any lifecycle (item table hashed): what the
    # admission, eviction and slot reuse themselves cost
    "lifecycle_auc_gap_vs_no_lifecycle": ("<=", 0.01),
    "lifecycle_skew_checks_passed": (">=", 1.0),
}
