"""`recpipe train` of a `model.type: item_to_item` config: EASE fitted in closed form, λ chosen on validation,
the model's weights set from it (recpipe.trainers.item_to_item has the method and its pure parts)."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.schema import query_key_feature
from recpipe.trainers.errors import TrainError
from recpipe.trainers.evaluation import ease
from recpipe.trainers.evaluation.candidates import read_clicks
from recpipe.trainers.evaluation.validation import Validator
from recpipe.trainers.item_to_item import LAMBDAS_TRIED, history_weights, score_table, table_rows, unfit_reason
from recpipe.trainers.model_dir import MAX_CHECKPOINTS, ModelDir, TrainState
from recpipe.trainers.models import build_model, dummy_batch
from recpipe.trainers.options import TrainOptions
from recpipe.trainers.prepare import prepare_run

__all__ = ["fit_item_to_item"]


def fit_item_to_item(opts: TrainOptions, say: Callable[[str], None]) -> TrainState:
    """Fit an item_to_item config into opts.model_dir (a rerun fits again and gives the same weights).

    Args:
        opts: the train options (the strategy, precision and steps do not apply: the fit is closed form, in
            this process).
        say: progress.

    Returns:
        Its TrainState: steps_done = the λ values tried, best_step = the one kept (1-based, in LAMBDAS_TRIED).

    Raises:
        TrainError: the model does not apply (unfit_reason), or the data's clicks exceed EASE's bounds.
    """
    prepared = prepare_run(opts, say)
    cfg, artifact = prepared.cfg, prepared.artifact
    why = unfit_reason(cfg, artifact)
    if why:
        raise TrainError(f"model.type item_to_item: {why}")
    if opts.run.strategy not in ("auto", "local"):
        say(f"train: note: item_to_item is fitted in closed form in this process; --strategy {opts.run.strategy} "
            f"does not apply")
    if opts.warm_start:
        say(f"train: note: item_to_item is fitted anew from the clicks; --warm-start {opts.warm_start} carries "
            f"nothing")
    t0 = time.perf_counter()
    model_dir = ModelDir(opts.model_dir)
    candidates, clicks = read_clicks(cfg, opts.data_dir, ("train", "validation"))
    n = len(candidates.ids)
    shape = (table_rows(cfg, artifact, query_key_feature(cfg)),
             table_rows(cfg, artifact, cfg.model.candidate_features[0]))
    train = clicks["train"].matrix(shape[0], n)
    too_big = ease.fits(train)
    if too_big:
        raise TrainError(f"model.type item_to_item: {too_big}")
    popularity = np.bincount(clicks["train"].candidate, minlength=n).astype(np.float64)
    model = build_model(cfg, artifact)
    model(dummy_batch(cfg))
    every_lambda = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, early_stopping=dataclasses.replace(cfg.train.early_stopping, patience=0)))
    validator = Validator(every_lambda, artifact, opts.data_dir, model_dir.validation_path, model_dir.best_prefix,
                          say)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), model_dir.checkpoints_dir,
                                         max_to_keep=MAX_CHECKPOINTS)
    source = f"each row's {model.history}" if model.history else f"each user's clicks ({model.query_key})"
    say(f"train: item_to_item: EASE over {train.nnz:,} train clicks of {shape[0]:,} user IDs x {n:,} candidates, "
        f"scoring {source}; λ in {', '.join(f'{lam:g}' for lam in LAMBDAS_TRIED)} scored on validation")
    for step, lam in enumerate(LAMBDAS_TRIED, 1):
        say(f"train: item_to_item: step {step}: λ {lam:g}")
        if model.history:
            weights, base = history_weights(ease.ease_weights(train, lam), popularity, candidates.ids, shape[1])
            model.item_weights.assign(weights)
            model.base.assign(base)
        else:
            model.user_scores.assign(score_table(ease.Ease(train, lam), train, popularity, candidates.ids, shape))
        validator(step, manager.save(checkpoint_number=step))
    h = validator.history
    if h.best_step is None:
        raise TrainError(f"model.type item_to_item: no λ has a validation {h.metric} score to choose by")
    lam = LAMBDAS_TRIED[h.best_step - 1]
    if not model.history:  # the kept model knows each user's validation clicks too
        before = sp.csr_matrix(train + clicks["validation"].matrix(shape[0], n))
        before.data[:] = 1.0
        model.user_scores.assign(score_table(ease.Ease(train, lam), before, popularity, candidates.ids, shape))
        kept = tf.train.Checkpoint(model=model)
        _ = kept.save_counter  # created, so the weights restore like any checkpoint (all objects matched)
        kept.write(model_dir.best_prefix)
    seconds = time.perf_counter() - t0
    scored = "from the rows' history" if model.history else "its users scored from their train and validation clicks"
    say(f"train: item_to_item: kept λ {lam:g} (validation {h.metric} {h.best:.4f}); {scored}, {seconds:.1f} s")
    state = TrainState(len(h.history), len(h.history), 0, 0.0, 0.0, float("nan"), "local", opts.run.precision,
                       cfg.train.batch_size, data_dir=PreprocessedData(opts.data_dir).root, best_step=h.best_step)
    model_dir.write_state(state)
    return state
