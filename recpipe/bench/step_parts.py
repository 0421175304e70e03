"""Where one training step of a ranking config goes (the roofline), and how far any implementation
of the model could lead the TFRS-tutorial peer, measured in one process on fixed in-memory batches (no input
pipeline):
  - the compiled train step of the model, of the same model without its cross layers, and without cross and
    deep layers: the differences are the cross layers' and the deep layers' time; what remains is the
    embedding lookups (and ID dedup), the logit, the loss and the optimizer's updates;
  - the peer's compiled train step (recpipe.bench.tfrs_peer: the same DCN-v2 the TFRS-tutorial way);
  - the model's cross and deep layers and logit alone, forward and backward (every weight's gradient and the
    gradient of their input), on the input the full model builds from a real batch: no lookups, no optimizer,
    no input. Every implementation of the model computes at least this, so the peer's step over it is the
    most any of them could lead the peer by (`bound_vs_peer`).
Every variant is built first, then timed round-robin (`rounds` rounds of `steps` steps each; medians), so a
shared machine's slow minute falls on all of them. The input pipeline's share is the train suite's real vs
synthetic runs.

    python -m recpipe.bench.step_parts DATA CONFIG [STEPS] [ROUNDS]   -> one JSON line on stdout
"""
from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from typing import Callable

import tensorflow as tf
import yaml

from recpipe.features.config import Config, parse_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.bench.tfrs_peer import TutorialDCN, check_supported
from recpipe.trainers.data import make_dataset
from recpipe.trainers.models import build_model
from recpipe.trainers.optim import optimizer_for

__all__ = ["step_parts"]

VARIANTS = {"full": {}, "no_cross": {"cross_layers": 0}, "embeddings_only": {"cross_layers": 0, "deep_layers": []}}


def _model_step(cfg: Config, data_dir: str) -> tuple[tf.keras.Model, Callable]:
    tf.keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg, PreprocessedData(data_dir).transform())
    model.compile(optimizer=optimizer_for(cfg, own_step=True))
    return model, tf.function(model.train_step)


def _peer_step(cfg: Config, data_dir: str) -> Callable:
    tf.keras.utils.set_random_seed(cfg.train.seed)
    peer = TutorialDCN(cfg, PreprocessedData(data_dir).transform().table_sizes())
    peer.compile(optimizer=optimizer_for(cfg))
    return tf.function(peer.train_step)


def _dense_layers_step(model: tf.keras.Model, batch: dict) -> Callable:
    """`model`'s own cross stack, deep layers and logit, forward and backward, on the x0 its interaction
    concatenates from `batch` (its embeddings, then its dense features), held as one variable: the gradients
    of every weight and of x0 are all returned (summed to one number), so none is pruned from the graph."""
    model(batch)  # builds every layer: a layer not built yet has no weights, and their gradients would be pruned
    by_name = model.embeddings(batch)
    x0 = tf.Variable(tf.concat([by_name[f["name"]] for f in model.embeddings.feature_specs]
                               + [tf.cast(batch[n], tf.float32)[:, None] for n in model.dense_features], axis=1))
    layers = [model.interaction, *model.deep, model.logit]
    weights = [w for layer in layers for w in layer.trainable_weights]
    tables = {v.ref() for v in model.embeddings.trainable_variables}
    dense_weights = {v.ref() for v in model.trainable_variables} - tables
    if {w.ref() for w in weights} != dense_weights:  # each left out would have its gradient pruned from the step
        raise ValueError(f"step_parts: {len(weights)} weights in the dense layers, not the model's "
                         f"{len(dense_weights)}")

    @tf.function
    def step(_batch):
        with tf.GradientTape() as tape:
            x = model.interaction([x0])
            for layer in layers[1:]:
                x = layer(x)
            y = tf.reduce_sum(tf.square(x))  # depends on the logits, as a loss does: their matmul is kept too
        grads = tape.gradient(y, [x0, *weights])
        return {"loss": tf.add_n([tf.reduce_sum(g) for g in grads])}
    return step


def _ms_per_step(step: Callable, batches: list, steps: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        out = step(batches[i % len(batches)])
    float(out["loss"])
    return 1000 * (time.perf_counter() - t0) / steps


def step_parts(data_dir: str, cfg_dict: dict, steps: int = 30, rounds: int = 3) -> dict:
    """ms per step of each variant (median over the rounds), the parts they give (ms and share of the full
    step), and the bound on any implementation's lead over the peer."""
    if cfg_dict["model"].get("type") != "dcn_v2":
        raise ValueError("step_parts: a dcn_v2 ranking config")
    cfg = parse_config(cfg_dict)
    check_supported(cfg)
    it = iter(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=False))
    batches = [next(it) for _ in range(4)]
    fns: dict[str, Callable] = {}
    for name, model_keys in VARIANTS.items():
        c = copy.deepcopy(cfg_dict)
        c["model"] = {**c["model"], **model_keys}
        model, fns[name] = _model_step(parse_config(c), data_dir)
        if name == "full":
            fns["dense_layers"] = _dense_layers_step(model, batches[0])
    fns["peer"] = _peer_step(cfg, data_dir)
    for step in fns.values():  # trace and warm up
        for b in batches:
            step(b)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, step in fns.items():
            times[name].append(_ms_per_step(step, batches, steps))
    ms = {name: statistics.median(v) for name, v in times.items()}
    parts = {"cross_layers": ms["full"] - ms["no_cross"], "deep_layers": ms["no_cross"] - ms["embeddings_only"],
             "embeddings_loss_optimizer": ms["embeddings_only"]}
    return {"batch_size": cfg.train.batch_size, "steps": steps, "rounds": rounds, "step_ms": ms,
            "step_ms_rounds": times, "parts_ms": parts,
            "parts_share": {k: v / ms["full"] for k, v in parts.items()},
            "bound_vs_peer": ms["peer"] / ms["dense_layers"]}


def main(argv: list[str]) -> None:
    with open(argv[1]) as fh:
        cfg = yaml.safe_load(fh)
    steps, rounds = (int(argv[2]) if len(argv) > 2 else 30), (int(argv[3]) if len(argv) > 3 else 3)
    print(json.dumps(step_parts(argv[0], cfg, steps, rounds)))


if __name__ == "__main__":
    main(sys.argv[1:])
