"""TFRS models over the sparse embeddings + normalised dense features: ranking (DCN-v2, DLRM) and
retrieval (two towers).

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

__all__ = ["model_spec", "SparseEmbeddings", "flat_ids", "ids_by_table", "accumulated_gradients", "micro_batches",
           "dense_flops_per_example", "RankingModel", "RetrievalModel", "build_model", "dummy_batch"]


def model_spec(cfg: Config, artifact: TransformArtifact) -> dict[str, Any]:
    """Plain-data description of the network (JSON-able, so layers stay serialisable)."""
    return {
        # Logistic regression: one weight per ID (a 1-wide table) and a linear term on the dense features.
        "tables": {name: {"rows": rows, "dim": 1 if cfg.model.type == "logistic" else
                          embedding_dim(cfg, cfg.sparse_by_name[name])}
                   for name, rows in artifact.table_sizes().items()},
        "sparse": [{"name": f.name, "table": cfg.table_owner(f).name, "multivalent": f.multivalent,
                    "combiner": f.combiner} for f in cfg.features.sparse],
        "dense": [d.name for d in cfg.features.dense],
        "model": {"task": cfg.model.task, "type": cfg.model.type, "cross_layers": cfg.model.cross_layers,
                  "low_rank": cfg.model.low_rank, "deep_layers": list(cfg.model.deep_layers),
                  "bottom_layers": list(cfg.model.bottom_layers), "tower_layers": list(cfg.model.tower_layers),
                  "query_features": list(cfg.model.query_features),
                  "candidate_features": list(cfg.model.candidate_features)},
    }


def flat_ids(ids) -> tf.Tensor:
    """Every ID of a feature's batch: a ragged list feature's flat values, else the tensor itself."""
    return ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids


def ids_by_table(sparse: list, features: dict) -> dict[str, list[tuple[str, tf.Tensor]]]:
    """(feature name, flat IDs) of every sparse feature present in `features`, grouped by the
    (possibly shared) table it reads."""
    grouped: dict[str, list] = {}
    for f in sparse:
        if f["name"] in features:
            grouped.setdefault(f["table"], []).append((f["name"], flat_ids(features[f["name"]])))
    return grouped


class SparseEmbeddings(tf.keras.layers.Layer):
    """Looks up every sparse feature in its (possibly shared) table; multivalent ones are pooled.

    dedup=True (unique-then-gather): the IDs of every feature that reads one table are
    concatenated, made unique, looked up once and gathered back, so the table is read (and its
    gradient carries) one row per distinct ID in the batch instead of one per occurrence.
    """

    def __init__(self, tables: dict, sparse: list, dedup: bool = False, **kwargs):
        super().__init__(**kwargs)
        self._tables_cfg, self._sparse_cfg, self._dedup = tables, sparse, dedup
        self.tables = {name: tf.keras.layers.Embedding(t["rows"], t["dim"], dtype="float32", name=f"emb_{name}")
                       for name, t in tables.items()}

    def call(self, features: dict) -> dict[str, tf.Tensor]:
        present = [f for f in self._sparse_cfg if f["name"] in features]  # e.g. a candidate-only batch
        vectors = self._lookup_unique(features) if self._dedup else {
            f["name"]: self.tables[f["table"]](flat_ids(features[f["name"]])) for f in present}
        out = {}
        for f in present:
            ids, vecs = features[f["name"]], vectors[f["name"]]
            if isinstance(ids, tf.RaggedTensor):
                pooled = tf.reduce_sum(ids.with_flat_values(vecs), axis=1)
                if f["combiner"] == "mean":
                    n = tf.cast(tf.maximum(ids.row_lengths(), 1), pooled.dtype)
                    pooled = pooled / n[:, None]
                out[f["name"]] = pooled
            else:
                out[f["name"]] = vecs
        return {k: tf.cast(v, self.compute_dtype) for k, v in out.items()}

    def _lookup_unique(self, features: dict) -> dict[str, tf.Tensor]:
        vectors = {}
        for table, named in ids_by_table(self._sparse_cfg, features).items():
            names, flats = [n for n, _ in named], [ids for _, ids in named]
            unique, index = tf.unique(tf.concat(flats, axis=0) if len(flats) > 1 else flats[0])
            rows = tf.gather(self.tables[table](unique), index)
            parts = tf.split(rows, tf.stack([tf.shape(x)[0] for x in flats]), num=len(flats)) \
                if len(flats) > 1 else [rows]
            vectors.update(zip(names, parts))
        return vectors

    def get_config(self):
        return {**super().get_config(), "tables": self._tables_cfg, "sparse": self._sparse_cfg, "dedup": self._dedup}


def micro_batches(batch: dict, k: int) -> list[dict]:
    """Split a batch into k equal micro-batches (k divides the batch size; checked by the config)."""
    if k == 1:
        return [batch]
    n = tf.shape(batch[LABEL_KEY])[0] // k
    return [{key: v[i * n:(i + 1) * n] for key, v in batch.items()} for i in range(k)]


def _add_gradients(a, b):
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def accumulated_gradients(model: tf.keras.Model, batch: dict, k: int, optimizer=None) -> tuple[list, tf.Tensor]:
    """Gradients of the mean loss over `batch`, computed over k micro-batches one after another
    (gradient accumulation: activation memory of batch/k rows, ONE optimizer step). Sparse
    (IndexedSlices) gradients are concatenated, not densified. With a LossScaleOptimizer the loss
    is scaled and the gradients unscaled. Returns (gradients, mean loss)."""
    scaled = optimizer is not None and hasattr(optimizer, "get_scaled_loss")
    grads, loss_sum = None, tf.constant(0.0)
    for mb in micro_batches(batch, k):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(mb, training=True) / k
            total = loss + tf.reduce_sum(model.losses) / k if model.losses else loss
            target = optimizer.get_scaled_loss(total) if scaled else total
        g = tape.gradient(target, model.trainable_variables)
        if scaled:
            g = optimizer.get_unscaled_gradients(g)
        grads = g if grads is None else [_add_gradients(x, y) for x, y in zip(grads, g)]
        loss_sum += tf.cast(loss, tf.float32)
    return grads, loss_sum


def _mlp(widths: list[int], name: str) -> list[tf.keras.layers.Layer]:
    return [tf.keras.layers.Dense(w, activation="relu", name=f"{name}_{i}") for i, w in enumerate(widths)]


class _Model(tfrs.Model):
    """tfrs.Model whose train_step accumulates over micro-batches (tuning.grad_accum_steps) and
    applies loss scaling when the optimizer has it (fp16)."""

    def train_step(self, inputs):
        grads, loss = accumulated_gradients(self, inputs, self.spec.get("runtime", {}).get("grad_accum_steps", 1),
                                            self.optimizer)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        metrics = {m.name: m.result() for m in self.metrics}
        metrics.update(loss=loss)
        return metrics

    def get_config(self):
        return {"spec": self.spec}


class RankingModel(_Model):
    """Click-through ranking: DCN-v2 (cross network + deep MLP) or DLRM (dot interaction)."""

    def __init__(self, spec: dict, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        m = spec["model"]
        runtime = spec.get("runtime", {})
        self.embeddings = SparseEmbeddings(spec["tables"], spec["sparse"], dedup=runtime.get("dedup_ids", False),
                                           name="embeddings")
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
        elif self.kind == "logistic":
            self.deep = []
        else:
            raise ValueError(f"model.type {self.kind!r} is not a ranking model")
        self.logit = tf.keras.layers.Dense(1, dtype="float32", name="logit")
        # XLA for the dense part while training only (serving sees every batch size: no recompiles);
        # set outside Keras' attribute tracking so checkpoints and SavedModels are unchanged.
        object.__setattr__(self, "_top_xla", tf.function(self._top, jit_compile=True)
                           if runtime.get("jit_dense") else None)
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
        by_name = self.embeddings(features)
        embedded = [by_name[f["name"]] for f in self.spec["sparse"]]
        dense = self._dense(features)
        top = self._top_xla if training and self._top_xla is not None else self._top
        return top(embedded, dense)

    def _top(self, embedded: list, dense: tf.Tensor | None) -> tf.Tensor:
        """Everything after the embedding lookups (the dense part)."""
        if self.kind == "logistic":
            x = tf.add_n([tf.cast(e, tf.float32) for e in embedded]) if embedded else 0.0
            return x + self.logit(dense) if dense is not None else x
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


class RetrievalModel(_Model):
    """Two-tower retrieval: query and candidate towers over their features' embeddings (+ dense),
    trained with tfrs.tasks.Retrieval's in-batch softmax; each clicked row is a positive pair and
    every other candidate in the batch a negative (rows are weighted by their label)."""

    def __init__(self, spec: dict, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        m = spec["model"]
        used = set(m["query_features"]) | set(m["candidate_features"])
        sparse = [f for f in spec["sparse"] if f["name"] in used]
        tables = {f["table"]: spec["tables"][f["table"]] for f in sparse}
        self.embeddings = SparseEmbeddings(tables, sparse, dedup=spec.get("runtime", {}).get("dedup_ids", False),
                                           name="embeddings")
        widths = m["tower_layers"]
        self.query_tower = [*_mlp(widths[:-1], "query"), tf.keras.layers.Dense(widths[-1], name="query_out")]
        self.candidate_tower = [*_mlp(widths[:-1], "candidate"),
                                tf.keras.layers.Dense(widths[-1], name="candidate_out")]
        self.task = tfrs.tasks.Retrieval()  # SUM of softmax cross-entropy; divided by the positives below

    def _encode(self, features: dict, embedded: dict, names: list[str], tower: list) -> tf.Tensor:
        parts = [embedded[n] if n in embedded else tf.cast(features[n], self.compute_dtype)[:, None] for n in names]
        x = tf.concat(parts, axis=1)
        for layer in tower:
            x = layer(x)
        return tf.cast(x, tf.float32)

    def query_embedding(self, features: dict) -> tf.Tensor:
        return self._encode(features, self.embeddings(features), self.spec["model"]["query_features"],
                            self.query_tower)

    def candidate_embedding(self, features: dict) -> tf.Tensor:
        return self._encode(features, self.embeddings(features), self.spec["model"]["candidate_features"],
                            self.candidate_tower)

    def call(self, features: dict, training: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
        embedded = self.embeddings(features)
        m = self.spec["model"]
        return (self._encode(features, embedded, m["query_features"], self.query_tower),
                self._encode(features, embedded, m["candidate_features"], self.candidate_tower))

    def compute_loss(self, features: dict, training: bool = False) -> tf.Tensor:
        query, candidate = self(features, training=training)
        weight = tf.cast(features[LABEL_KEY], tf.float32)
        total = self.task(query, candidate, sample_weight=weight, compute_metrics=False)
        return total / tf.maximum(tf.reduce_sum(weight), 1.0)


def build_model(cfg: Config, artifact: TransformArtifact) -> tf.keras.Model:
    spec = model_spec(cfg, artifact)
    t = cfg.train.tuning  # how to compute, not what: changing these never changes the weights' layout
    spec["runtime"] = {"dedup_ids": t.dedup_ids, "jit_dense": t.jit_dense, "grad_accum_steps": t.grad_accum_steps}
    if cfg.model.task == "retrieval":
        return RetrievalModel(spec, name="two_tower_retrieval")
    return RankingModel(spec, name=f"{cfg.model.type}_ranking")


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


def dense_flops_per_example(spec: dict) -> int:
    """Forward FLOPs of the dense part of a ranking model per example (2 per multiply-add of each
    matmul; element-wise ops not counted). Training costs about 3x this (forward + two backward
    matmuls). Embedding lookups are memory traffic, not FLOPs."""
    m = spec["model"]
    dims = {f["name"]: spec["tables"][f["table"]]["dim"] for f in spec["sparse"]}
    width = sum(dims.values()) + len(spec["dense"])

    def mlp(n_in: int, widths: list[int]) -> tuple[int, int]:
        flops = 0
        for w in widths:
            flops, n_in = flops + 2 * n_in * w, w
        return flops, n_in

    if m["type"] == "logistic":
        return 2 * len(spec["dense"])
    if m["type"] == "dcn_v2":
        per_cross = 2 * width * width if not m["low_rank"] else 4 * width * m["low_rank"]
        deep, last = mlp(width, m["deep_layers"])
        return m["cross_layers"] * per_cross + deep + 2 * last
    if m["type"] == "dlrm":
        dim = next(iter(spec["tables"].values()))["dim"]
        bottom, _ = mlp(len(spec["dense"]) or 1, [*m["bottom_layers"], dim])
        n = len(spec["sparse"]) + 1
        interaction = 2 * n * n * dim
        top, last = mlp(dim + n * n, m["deep_layers"])  # skip_gather: the whole (masked) n x n matrix
        return bottom + interaction + top + 2 * last
    raise ValueError(f"model type {m['type']!r}: no ranking FLOP count")
