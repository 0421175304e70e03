"""The peer of `train_embedding_heavy_vs_tfrs_fit`: a DLRM trained the way the TFRS tutorials train a ranking
model, on the embedding-heavy config of `recpipe bench embedding`.

A user who skips recpipe writes a `tfrs.Model` with one `tf.keras.layers.Embedding` per table, a bottom MLP on
the dense features, `tfrs.layers.feature_interaction.DotInteraction` (its defaults: the products above the
diagonal, gathered) and a top MLP, loads the train split into memory
(`Dataset.from_tensor_slices(...).batch(...).cache()`) and calls `model.fit`. The tables (rows from the
transform artifact, width from the config), MLP widths, optimizer, learning rate, batch size and threads are
the config's. Its eval AUC is scored by the function `recpipe evaluate` uses, after the same examples.

    python -m recpipe.bench.tfrs_dlrm_peer DATA CONFIG STEPS   -> one JSON line on stdout

`examples_per_s_steady` times the second half of the steps, as `recpipe train`'s steady rate does.
"""
from __future__ import annotations

import json
import sys

import tensorflow as tf
import tensorflow_recommenders as tfrs

from recpipe.bench.tfrs_peer import SecondHalfTimer, in_memory
from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config, embedding_dim, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.evaluation.scoring import ranking_scores
from recpipe.trainers.optim import optimizer_for

__all__ = ["TutorialDLRM", "run_dlrm_peer"]


class TutorialDLRM(tfrs.Model):
    """DLRM the TFRS way: an Embedding per single-valued sparse feature, a ReLU bottom MLP to the tables'
    width, DotInteraction over [bottom, embeddings...], a ReLU top MLP and a logit.

    Args:
        cfg: a dlrm ranking config whose sparse features are single-valued and own their tables.
        table_rows: rows of each table (the transform artifact's table_sizes()).

    Raises:
        ValueError: another model type, or multivalent or shared features.
    """

    def __init__(self, cfg: Config, table_rows: dict[str, int]):
        super().__init__()
        if cfg.model.type != "dlrm" or any(f.multivalent or f.share_embedding_with for f in cfg.features.sparse):
            raise ValueError("tfrs dlrm peer: a dlrm config of single-valued features with tables of their own")
        dim = embedding_dim(cfg, cfg.features.sparse[0])
        self.sparse = [f.name for f in cfg.features.sparse]
        self.dense_names = [d.name for d in cfg.features.dense]
        self.tables = {n: tf.keras.layers.Embedding(table_rows[n], dim, name=f"embedding_{n}") for n in self.sparse}
        self.bottom = [tf.keras.layers.Dense(w, activation="relu") for w in [*cfg.model.bottom_layers, dim]]
        self.interaction = tfrs.layers.feature_interaction.DotInteraction()
        self.top = [tf.keras.layers.Dense(w, activation="relu") for w in cfg.model.deep_layers]
        self.logit = tf.keras.layers.Dense(1)
        self.task = tfrs.tasks.Ranking(loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
                                       metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc")])

    def call(self, features: dict) -> tf.Tensor:
        """Logits [B, 1].

        Args:
            features: a batch of the preprocessed shards.

        Returns:
            The logits.
        """
        x = tf.stack([features[n] for n in self.dense_names], axis=1)
        for layer in self.bottom:
            x = layer(x)
        products = self.interaction([x, *[self.tables[n](features[n]) for n in self.sparse]])
        y = tf.concat([x, products], axis=1)
        for layer in self.top:
            y = layer(y)
        return self.logit(y)

    def compute_loss(self, features: dict, training: bool = False) -> tf.Tensor:
        """The Ranking task's loss on a batch.

        Args:
            features: a batch of the preprocessed shards, label included.
            training: unused (no dropout).

        Returns:
            The mean binary cross-entropy.
        """
        return self.task(labels=tf.expand_dims(features[LABEL_KEY], 1), predictions=self(features))


def run_dlrm_peer(data_dir: str, cfg: Config, steps: int) -> dict:
    """Train the peer for `steps` batches on the train split held in memory, then score the eval split.

    Args:
        data_dir: a `recpipe preprocess` output folder.
        cfg: its dlrm config.
        steps: batches of train.batch_size (two epochs of half of them: the second is timed).

    Returns:
        {"examples_per_s_steady", "examples", "train_rows_in_memory", "auc"}.
    """
    t = cfg.train.tuning
    if t.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(t.intra_op_threads)
    if t.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(t.inter_op_threads)
    batch, half = cfg.train.batch_size, max(steps // 2, 1)
    train = in_memory(cfg, data_dir, "train")
    rows = int(train[LABEL_KEY].shape[0])
    cached = (tf.data.Dataset.from_tensor_slices(train)
              .shuffle(rows, seed=cfg.train.seed, reshuffle_each_iteration=False)
              .batch(batch, drop_remainder=True).cache())
    for _ in cached:  # fill the cache before the clock starts
        pass
    tf.keras.utils.set_random_seed(cfg.train.seed)
    model = TutorialDLRM(cfg, PreprocessedData(data_dir).transform().table_sizes())
    model.compile(optimizer=optimizer_for(cfg))
    timer = SecondHalfTimer()
    model.fit(cached.repeat(), steps_per_epoch=half, epochs=2, verbose=0, callbacks=[timer])
    auc = ranking_scores(cfg, model, data_dir, "eval")["auc"]
    return {"examples_per_s_steady": half * batch / timer.seconds, "examples": 2 * half * batch,
            "train_rows_in_memory": rows, "auc": auc}


def main(argv: list[str]) -> None:
    """`python -m recpipe.bench.tfrs_dlrm_peer DATA CONFIG STEPS`: one JSON line on stdout.

    Args:
        argv: DATA CONFIG STEPS.
    """
    data_dir, cfg_path, steps = argv
    print(json.dumps(run_dlrm_peer(data_dir, load_config(cfg_path), int(steps))))


if __name__ == "__main__":
    main(sys.argv[1:])
