"""Evaluate a trained model on the eval split: flat metrics JSON (the eval split is touched here only)."""
from __future__ import annotations

import dataclasses
import os

from recpipe.common import fsio
from recpipe.features.config import SliceSpec
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data import naming_bad_shards
from recpipe.trainers.data_copy import check_whole_copy
from recpipe.trainers.errors import TrainError
from recpipe.trainers.model_dir import ModelDir, check_data_matches, check_same_transform, load_trained
from recpipe.trainers.evaluation.plots import reliability_png, slices_png
from recpipe.trainers.evaluation.scoring import Slicing, baselines, score, undefined_metrics
from recpipe.trainers.evaluation.slices import check_slices
from recpipe.trainers.selection import SELECTION_FILE, Selection

__all__ = ["evaluate"]


def evaluate(model_dir: str, data_dir: str, out_path: str | None = None, batch_size: int = 4096,
             slices: list[SliceSpec] | None = None) -> dict:
    """Eval-split metrics: auc, logloss, examples, positive_rate, calibration (mean prediction ÷
    observed rate) and a reliability table (ranking), or recall/ndcg/mrr at 10, 50 and 100, examples
    and candidates (retrieval, against every candidate in the data); `baselines` holds the trivial
    models' scores on the same split (constant click rate; most popular candidates). The model's best
    checkpoint on the validation split is the one evaluated, when training kept one. With the config's
    evaluate.slices, `slices` holds the AUC (ranking) or recall@10 (retrieval) per slice, and
    MODEL_DIR/slices.png their bars; `slices` replaces the config's. A model kept by `model.type: auto` has
    `selection`: every candidate's validation score (recpipe.trainers.selection). A metric the split cannot define
    (AUC on rows of one label) is null, and `undefined` says why, per metric."""
    cfg, trained_with, model = load_trained(model_dir)
    data = PreprocessedData(data_dir)
    artifact = check_data_matches(cfg, data, f"the model in {model_dir}")
    check_same_transform(trained_with, artifact, model_dir, data.root,
                         "Evaluate it on data of the run it was trained on"
                         + ModelDir(model_dir).trained_on_hint(data.root, " ({})")
                         + "; to compare models on new logs, score their raw rows through the exported "
                           "SavedModels, as the daily bless does")
    if artifact.row_counts.get("eval") == 0:
        raise TrainError(f"{data_dir}: the eval split is empty (nothing to evaluate on)")
    check_whole_copy(data)
    if slices is not None:  # instead of the config's evaluate.slices, checked as they would be there
        cfg = check_slices(cfg, slices)
    slicing = Slicing(tuple(cfg.evaluate.slices), artifact) if cfg.evaluate.slices else None
    with naming_bad_shards(data_dir):
        metrics = score(cfg, model, data_dir, "eval", batch_size, slices=slicing)
        metrics["baselines"] = baselines(cfg, data_dir, "eval")  # every number with its reference beside it
    selection = Selection.read(os.path.join(model_dir, SELECTION_FILE))
    if selection is not None:  # model.type auto: every candidate's validation score beside the kept one's eval
        metrics["selection"] = dataclasses.asdict(selection)
    if "reliability" in metrics:
        reliability_png(metrics["reliability"], metrics["positive_rate"], ModelDir(model_dir).reliability_png)
    if "slices" in metrics:
        slices_png(metrics["slices"], "auc" if cfg.model.task != "retrieval" else "recall_at_10",
                   ModelDir(model_dir).slices_png)
    why = undefined_metrics(metrics, "eval")
    metrics = fsio.json_safe({**metrics, "undefined": why} if why else metrics)
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        fsio.write_json(out_path, metrics, sort_keys=False, only_if_changed=True)  # reruns leave it untouched
    return metrics

