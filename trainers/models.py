"""TFRS ranking models (DCN-v2, DLRM) over the sparse embeddings + normalised dense features.

Embedding sizes come from the transform artifact (`model_spec`), never from hand-typed numbers.
Embedding tables and the final logit stay float32 under mixed precision.
"""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

from typing import Any  # noqa: E402

import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402

from features.artifact import TransformArtifact  # noqa: E402
from features.canonical import LABEL_KEY  # noqa: E402
from features.config import Config, embedding_dim  # noqa: E402

__all__ = ["model_spec", "SparseEmbeddings", "RankingModel", "build_model", "dummy_batch"]


def model_spec(cfg: Config, artifact: TransformArtifact) -> dict[str, Any]:
    """Plain-data description of the network (JSON-able, so layers stay serialisable)."""
    return {
        "tables": {name: {"rows": rows, "dim": embedding_dim(cfg, cfg.sparse_by_name[name])}
                   for name, rows in artifact.table_sizes().items()},
        "sparse": [{"name": f.name, "table": cfg.table_owner(f).name, "multivalent": f.multivalent,
                    "combiner": f.combiner} for f in cfg.features.sparse],
        "dense": [d.name for d in cfg.features.dense],
        "model": {"type": cfg.model.type, "cross_layers": cfg.model.cross_layers, "low_rank": cfg.model.low_rank,
                  "deep_layers": list(cfg.model.deep_layers), "bottom_layers": list(cfg.model.bottom_layers)},
    }


class SparseEmbeddings(tf.keras.layers.Layer):
    """Looks up every sparse feature in its (possibly shared) table; multivalent ones are pooled."""

    def __init__(self, tables: dict, sparse: list, **kwargs):
        super().__init__(**kwargs)
        self._tables_cfg, self._sparse_cfg = tables, sparse
        self.tables = {name: tf.keras.layers.Embedding(t["rows"], t["dim"], dtype="float32", name=f"emb_{name}")
                       for name, t in tables.items()}

    def call(self, features: dict) -> list[tf.Tensor]:
        out = []
        for f in self._sparse_cfg:
            table = self.tables[f["table"]]
            ids = features[f["name"]]
            if isinstance(ids, tf.RaggedTensor):
                vecs = tf.ragged.map_flat_values(table, ids)
                pooled = tf.reduce_sum(vecs, axis=1)
                if f["combiner"] == "mean":
                    n = tf.cast(tf.maximum(ids.row_lengths(), 1), pooled.dtype)
                    pooled = pooled / n[:, None]
                out.append(pooled)
            else:
                out.append(table(ids))
        return [tf.cast(v, self.compute_dtype) for v in out]

    def get_config(self):
        return {**super().get_config(), "tables": self._tables_cfg, "sparse": self._sparse_cfg}


def _mlp(widths: list[int], name: str) -> list[tf.keras.layers.Layer]:
    return [tf.keras.layers.Dense(w, activation="relu", name=f"{name}_{i}") for i, w in enumerate(widths)]


class RankingModel(tfrs.Model):
    """Click-through ranking: DCN-v2 (cross network + deep MLP) or DLRM (dot interaction)."""

    def __init__(self, spec: dict, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        m = spec["model"]
        self.embeddings = SparseEmbeddings(spec["tables"], spec["sparse"], name="embeddings")
        self.kind = m["type"]
        if self.kind == "dcn_v2":
            self.cross = [tfrs.layers.dcn.Cross(projection_dim=m["low_rank"], name=f"cross_{i}")
                          for i in range(m["cross_layers"])]
            self.deep = _mlp(m["deep_layers"], "deep")
        elif self.kind == "dlrm":
            dim = next(iter(spec["tables"].values()))["dim"]
            self.bottom = _mlp([*m["bottom_layers"], dim], "bottom")
            self.interaction = tfrs.layers.feature_interaction.DotInteraction(self_interaction=False,
                                                                              skip_gather=True)
            self.deep = _mlp(m["deep_layers"], "top")
        else:
            raise ValueError(f"model.type {self.kind!r} is not a ranking model")
        self.logit = tf.keras.layers.Dense(1, dtype="float32", name="logit")
        self.task = tfrs.tasks.Ranking(
            # SUM, divided by the batch size in compute_loss: strategies forbid the implicit mean.
            loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.SUM),
            metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc", num_thresholds=1000)])

    def _dense(self, features: dict) -> tf.Tensor | None:
        if not self.spec["dense"]:
            return None
        cols = [tf.cast(features[name], self.compute_dtype) for name in self.spec["dense"]]
        return tf.stack(cols, axis=1)

    def call(self, features: dict, training: bool = False) -> tf.Tensor:
        """Logits [B, 1] (float32)."""
        embedded = self.embeddings(features)
        dense = self._dense(features)
        if self.kind == "dcn_v2":
            x0 = tf.concat([*embedded, dense] if dense is not None else embedded, axis=1)
            x = x0
            for layer in self.cross:
                x = layer(x0, x)
        else:
            bottom = dense if dense is not None else tf.zeros([tf.shape(embedded[0])[0], 1], self.compute_dtype)
            for layer in self.bottom:
                bottom = layer(bottom)
            x = tf.concat([bottom, self.interaction([bottom, *embedded])], axis=1)
        for layer in self.deep:
            x = layer(x)
        return self.logit(x)

    def compute_loss(self, features: dict, training: bool = False) -> tf.Tensor:
        labels = tf.expand_dims(features[LABEL_KEY], 1)
        total = self.task(labels=labels, predictions=self(features, training=training), training=training)
        return total / tf.cast(tf.shape(labels)[0], total.dtype)

    def train_step(self, inputs):
        # tfrs.Model.train_step plus loss scaling when the optimizer has it (mixed_float16).
        opt = self.optimizer
        with tf.GradientTape() as tape:
            loss = self.compute_loss(inputs, training=True)
            total = loss + tf.reduce_sum(self.losses) if self.losses else loss
            scaled = opt.get_scaled_loss(total) if hasattr(opt, "get_scaled_loss") else total
        grads = tape.gradient(scaled, self.trainable_variables)
        if hasattr(opt, "get_unscaled_gradients"):
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, self.trainable_variables))
        metrics = {m.name: m.result() for m in self.metrics}
        metrics.update(loss=loss, total_loss=total)
        return metrics

    def get_config(self):
        return {"spec": self.spec}


def build_model(cfg: Config, artifact: TransformArtifact) -> tf.keras.Model:
    return RankingModel(model_spec(cfg, artifact), name=f"{cfg.model.type}_ranking")


def dummy_batch(cfg: Config, n: int = 2) -> dict:
    """A well-formed batch of ID 0 / value 0 rows, to build a model's variables."""
    batch: dict = {}
    for f in cfg.features.sparse:
        ids = tf.zeros([n], tf.int64)
        batch[f.name] = tf.RaggedTensor.from_row_lengths(ids, tf.ones([n], tf.int64)) if f.multivalent else ids
    for d in cfg.features.dense:
        batch[d.name] = tf.zeros([n], tf.float32)
    batch[LABEL_KEY] = tf.zeros([n], tf.float32)
    return batch
