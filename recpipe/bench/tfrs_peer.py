"""The peer of `train_vs_tfrs_fit`: the same DCN-v2 trained the way the TFRS tutorials do it.

A user who skips recpipe writes a `tfrs.Model` with one `tf.keras.layers.Embedding` per table,
`tfrs.layers.dcn.Cross` layers and a Dense tower, loads the data into memory
(`Dataset.from_tensor_slices(...).batch(...).cache()`) and calls `model.fit`. This module does
exactly that, with the tables (rows and widths from the transform artifact), cross layers, deep
layers, optimizer, learning rate, batch size and precision of a recpipe config, on the train split
of a preprocessed data dir (read once into memory: the peer pays nothing for input). Its eval AUC is
scored by the function `recpipe evaluate` uses, after the same number of examples as our run.

    python -m recpipe.bench.tfrs_peer DATA CONFIG STEPS fp32|bf16   -> one JSON line on stdout

`examples_per_s_steady` times the second half of the steps (the first half holds tracing and
warm-up), as `recpipe train`'s steady rate does.
"""
from __future__ import annotations

import json
import sys
import time

import tensorflow as tf
import tensorflow_recommenders as tfrs

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config, embedding_dim, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data import make_dataset
from recpipe.trainers.optim import optimizer_for, precision_policy
from recpipe.trainers.evaluation.scoring import ranking_scores

__all__ = ["SecondHalfTimer", "TutorialDCN", "check_supported", "in_memory", "run_peer"]


def check_supported(cfg: Config) -> None:
    """The peer mirrors a DCN-v2 ranking config without wide logit, dropout or embedding L2."""
    m = cfg.model
    if m.task != "ranking" or m.type != "dcn_v2":
        raise ValueError(f"tfrs peer: a dcn_v2 ranking model only (got {m.task}/{m.type})")
    if m.wide or m.dropout or cfg.train.embedding_l2:
        raise ValueError("tfrs peer: wide, dropout and embedding_l2 are not part of the tutorial model")


class TutorialDCN(tfrs.Model):
    """DCN-v2 as in TFRS' "Deep & Cross Network" tutorial: an Embedding per table, x0 = [embeddings,
    dense], Cross layers, a ReLU tower and a float32 logit; multivalent features are pooled with
    their combiner, shared tables are one Embedding."""

    def __init__(self, cfg: Config, table_rows: dict[str, int]):
        super().__init__()
        self.sparse = [(f.name, cfg.table_owner(f).name, f.multivalent, f.combiner) for f in cfg.features.sparse]
        self.dense_names = [d.name for d in cfg.features.dense]
        self.tables = {t: tf.keras.layers.Embedding(table_rows[t], embedding_dim(cfg, cfg.sparse_by_name[t]),
                                                    name=f"embedding_{t}")
                       for t in dict.fromkeys(t for _, t, _, _ in self.sparse)}
        self.cross = [tfrs.layers.dcn.Cross(projection_dim=cfg.model.low_rank, kernel_initializer="glorot_uniform")
                      for _ in range(cfg.model.cross_layers)]
        self.deep = [tf.keras.layers.Dense(w, activation="relu") for w in cfg.model.deep_layers]
        self.logit = tf.keras.layers.Dense(1, dtype="float32")
        self.task = tfrs.tasks.Ranking(loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                                       metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc")])

    def call(self, features: dict) -> tf.Tensor:
        parts = []
        for name, table, multivalent, combiner in self.sparse:
            vectors = self.tables[table](features[name])
            if multivalent:  # ragged [B, None, d] -> [B, d]; an empty list pools to zeros
                pooled = tf.reduce_sum(vectors, axis=1)
                if combiner == "mean":
                    n = tf.maximum(features[name].row_lengths(), 1)
                    pooled = pooled / tf.cast(n, pooled.dtype)[:, None]
                vectors = pooled
            parts.append(vectors)
        if self.dense_names:
            parts.append(tf.stack([tf.cast(features[n], self.compute_dtype) for n in self.dense_names], axis=1))
        x0 = tf.concat([tf.cast(p, self.compute_dtype) for p in parts], axis=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        for layer in self.deep:
            x = layer(x)
        return self.logit(x)

    def compute_loss(self, features: dict, training: bool = False) -> tf.Tensor:
        return self.task(labels=tf.expand_dims(features[LABEL_KEY], 1), predictions=self(features))


def in_memory(cfg: Config, data_dir: str, split: str) -> dict:
    """The whole split as one tensor per column (ragged for multivalent features)."""
    columns: dict[str, list] = {}
    for batch in make_dataset(cfg, data_dir, split, 65_536, training=False):
        for k, v in batch.items():
            columns.setdefault(k, []).append(v)
    return {k: tf.concat(v, axis=0) for k, v in columns.items()}


class SecondHalfTimer(tf.keras.callbacks.Callback):
    """Wall time of the second epoch (model.fit runs two of half the steps each)."""

    def __init__(self):
        super().__init__()
        self.seconds = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            self.seconds = time.perf_counter() - self.t0


def run_peer(data_dir: str, cfg: Config, steps: int, precision: str = "fp32") -> dict:
    check_supported(cfg)
    batch = cfg.train.batch_size
    half = max(steps // 2, 1)
    data = PreprocessedData(data_dir)
    table_rows = data.transform().table_sizes()
    train = in_memory(cfg, data_dir, "train")
    rows = int(train[LABEL_KEY].shape[0])
    cached = (tf.data.Dataset.from_tensor_slices(train)
              .shuffle(rows, seed=cfg.train.seed, reshuffle_each_iteration=False)
              .batch(batch, drop_remainder=True).cache())
    for _ in cached:  # fill the cache before the clock starts: every step reads batches from memory
        pass
    ds = cached.repeat()
    with precision_policy(precision):  # what a tutorial does: the global Keras policy before building
        tf.keras.utils.set_random_seed(cfg.train.seed)
        model = TutorialDCN(cfg, table_rows)
        model.compile(optimizer=optimizer_for(cfg))
        timer = SecondHalfTimer()
        model.fit(ds, steps_per_epoch=half, epochs=2, verbose=0, callbacks=[timer])
    auc = ranking_scores(cfg, model, data_dir, "eval")["auc"]
    return {"examples_per_s_steady": half * batch / timer.seconds, "examples": 2 * half * batch,
            "train_rows_in_memory": rows, "precision": precision, "auc": auc}


def main(argv: list[str]) -> None:
    data_dir, cfg_path, steps, precision = argv
    print(json.dumps(run_peer(data_dir, load_config(cfg_path), int(steps), precision)))


if __name__ == "__main__":
    main(sys.argv[1:])
