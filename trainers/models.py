"""TFRS models over the sparse embeddings + normalised dense features: ranking (DCN-v2, DLRM,
logistic regression) and retrieval (two towers); and item-to-item retrieval, a table of scores fitted in closed form.

The models take their building blocks (recpipe.trainers.layers) as arguments, TFRS style; `build_model`
makes them from the typed config and the transform artifact (table sizes are produced data, never
hand-typed numbers). Embedding tables and the final logit stay float32 under mixed precision.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config, embedding_dim
from recpipe.features.schema import history_feature, logq_correction, query_key_feature
from recpipe.trainers.errors import TrainError
from recpipe.trainers.gradients import accumulated_gradients
from recpipe.trainers.item_to_item import TIE as ITEM_TO_ITEM_TIE
from recpipe.trainers.item_to_item import known_ids
from recpipe.trainers.layers import CrossStack, DotInteractionBlock, SparseEmbeddings, mlp, register

__all__ = ["ItemToItemModel", "RankingModel", "RetrievalModel", "build_model", "compiled_model", "dummy_batch",
           "embedding_layer", "table_shapes"]


class _Model(tfrs.Model):
    """tfrs.Model whose train_step accumulates over `grad_accum_steps` micro-batches and applies
    loss scaling when the optimizer has it (fp16).

    `autograph`: whether the model's steps and functions are traced with AutoGraph. TFRS's Retrieval
    task needs it (it takes len() of a tensor); a model whose branches and loops are all over Python
    values (the config, the feature list) sets False and saves the conversion's tracing time."""

    autograph = True

    def __init__(self, grad_accum_steps: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.grad_accum_steps = grad_accum_steps

    def train_step(self, inputs):
        grads, loss = accumulated_gradients(self, inputs, self.grad_accum_steps, self.optimizer)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        metrics = {m.name: m.result() for m in self.metrics}
        metrics.update(loss=loss)
        return metrics


@register
class RankingModel(_Model):
    """Click-through ranking: logit = top MLP(interaction(embeddings, dense)) [+ wide logit].

    interaction: a CrossStack (DCN-v2), a DotInteractionBlock (DLRM), or None: logistic
    regression, logit = sum of the features' one-wide embeddings (a weight per ID) + a linear term
    on the dense features.
    wide: one-wide embeddings whose sum (+ a linear term on the dense features) is added to the deep
    logit, as in Wide & Deep. dropout: after each deep layer. embedding_l2: L2 on the looked-up rows
    (mean over the batch of each feature's squared norm), added to the loss.
    """

    def __init__(self, embeddings: SparseEmbeddings, interaction: Optional[tf.keras.layers.Layer],
                 deep_layers: list, dense_features: list, jit_dense: bool = False, grad_accum_steps: int = 1,
                 wide: Optional[SparseEmbeddings] = None, dropout: float = 0.0, embedding_l2: float = 0.0,
                 **kwargs):
        super().__init__(grad_accum_steps=grad_accum_steps, **kwargs)
        self.embeddings = embeddings
        self.interaction = interaction
        self.deep_layers, self.dense_features, self.jit_dense = list(deep_layers), list(dense_features), jit_dense
        self.dropout, self.embedding_l2 = dropout, embedding_l2
        self.deep = mlp(self.deep_layers, "deep", dropout)
        self.logit = tf.keras.layers.Dense(1, dtype="float32", name="logit")
        self.wide = wide
        if wide is not None and self.dense_features:
            self.wide_dense = tf.keras.layers.Dense(1, dtype="float32", name="wide_dense")
        # XLA for the dense part while training only (serving sees every batch size: no recompiles);
        # set outside Keras' attribute tracking so checkpoints and SavedModels are unchanged.
        object.__setattr__(self, "_top_xla", tf.function(self._top, jit_compile=True) if jit_dense else None)
        self.task = tfrs.tasks.Ranking(
            # SUM, divided by the batch size in compute_loss: strategies forbid the implicit mean.
            loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.SUM),
            metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc", num_thresholds=1000)])

    # Traced without AutoGraph: about 1 s less CPU in each training process (9 % of a 24-step quick run)
    # and 6 s in a 2-rank Horovod one. Keras layers called inside inherit the setting, so a layer of this
    # model that needs tensor-dependent control flow must use tf.cond / tf.while_loop itself.
    autograph = False

    @tf.autograph.experimental.do_not_convert
    def train_step(self, inputs):
        return super().train_step(inputs)

    @tf.autograph.experimental.do_not_convert
    def test_step(self, inputs):
        return super().test_step(inputs)

    def _dense(self, features: dict) -> tf.Tensor | None:
        if not self.dense_features:
            return None
        return tf.stack([tf.cast(features[name], self.compute_dtype) for name in self.dense_features], axis=1)

    def call(self, features: dict, training: bool = False) -> tf.Tensor:
        """Logits [B, 1] (float32)."""
        return self._forward(features, training)[0]

    def _forward(self, features: dict, training: bool) -> tuple[tf.Tensor, list]:
        """(logits [B, 1] float32, every looked-up embedding: the deep ones, then the wide ones)."""
        by_name = self.embeddings(features)
        embedded = [by_name[f["name"]] for f in self.embeddings.feature_specs]
        top = self._top_xla if training and self._top_xla is not None else self._top
        dense = self._dense(features)
        logits = top(embedded, dense, training)
        if self.wide is None:
            return logits, embedded
        by_name = self.wide(features)
        wide = [by_name[f["name"]] for f in self.wide.feature_specs]
        logits = logits + tf.add_n([tf.cast(e, tf.float32) for e in wide])
        if dense is not None:
            logits = logits + self.wide_dense(dense)
        return logits, embedded + wide

    def _top(self, embedded: list, dense: tf.Tensor | None, training: bool = False) -> tf.Tensor:
        """Everything after the embedding lookups (the dense part)."""
        if self.interaction is None:
            x = tf.add_n([tf.cast(e, tf.float32) for e in embedded]) if embedded else 0.0
            return x + self.logit(dense) if dense is not None else x
        x = self.interaction(embedded, dense)
        for layer in self.deep:
            x = layer(x, training=training)
        return self.logit(x)

    def compute_loss(self, features: dict, training: bool = False) -> tf.Tensor:
        labels = tf.expand_dims(features[LABEL_KEY], 1)
        logits, embedded = self._forward(features, training)
        total = self.task(labels=labels, predictions=logits, training=training)
        loss = total / tf.cast(tf.shape(labels)[0], total.dtype)
        if self.embedding_l2 and training and embedded:
            squared = tf.add_n([tf.reduce_sum(tf.square(tf.cast(e, tf.float32)), axis=1) for e in embedded])
            loss = loss + self.embedding_l2 * tf.reduce_mean(squared)
        return loss

    def get_config(self):
        return {"embeddings": tf.keras.layers.serialize(self.embeddings),
                "interaction": tf.keras.layers.serialize(self.interaction) if self.interaction is not None else None,
                "deep_layers": self.deep_layers, "dense_features": self.dense_features, "jit_dense": self.jit_dense,
                "grad_accum_steps": self.grad_accum_steps, "name": self.name,
                "wide": tf.keras.layers.serialize(self.wide) if self.wide is not None else None,
                "dropout": self.dropout, "embedding_l2": self.embedding_l2}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["embeddings"] = tf.keras.layers.deserialize(config["embeddings"])
        if config.get("wide") is not None:
            config["wide"] = tf.keras.layers.deserialize(config["wide"])
        if config.get("interaction") is not None:
            config["interaction"] = tf.keras.layers.deserialize(config["interaction"])
        return cls(**config)


@register
class RetrievalModel(_Model):
    """Two-tower retrieval: query and candidate towers over their features' embeddings (+ dense),
    trained with tfrs.tasks.Retrieval's in-batch softmax; each clicked row is a positive pair and
    every other candidate in the batch a negative (rows are weighted by their label)."""

    def __init__(self, embeddings: SparseEmbeddings, query_features: list, candidate_features: list,
                 tower_layers: list, grad_accum_steps: int = 1, temperature: Optional[float] = None,
                 candidate_log_q: Optional[np.ndarray] = None, uniform_negatives: int = 0,
                 candidate_ids: int = 0, remove_accidental_hits: bool = False, **kwargs):
        super().__init__(grad_accum_steps=grad_accum_steps, **kwargs)
        self.temperature = temperature
        # mixed negatives (Yang et al., WWW 2020): besides the in-batch candidates, `uniform_negatives` IDs
        # drawn uniformly from [0, candidate_ids) (the first candidate feature's known IDs) each step
        self.uniform_negatives, self.candidate_ids = int(uniform_negatives), int(candidate_ids)
        # log sampling probability per ID of the first candidate feature (logQ correction); a constant
        # of the training run, built from the artifact, kept out of checkpoints and the Keras config
        object.__setattr__(self, "_log_q", None if candidate_log_q is None else
                           tf.constant(candidate_log_q, tf.float32))
        self.embeddings = embeddings
        self.query_features, self.candidate_features = list(query_features), list(candidate_features)
        self.tower_layers = list(tower_layers)
        widths = self.tower_layers
        self.query_tower = [*mlp(widths[:-1], "query"), tf.keras.layers.Dense(widths[-1], name="query_out")]
        self.candidate_tower = [*mlp(widths[:-1], "candidate"),
                                tf.keras.layers.Dense(widths[-1], name="candidate_out")]
        # SUM of softmax CE (divided by the positives); with remove_accidental_hits, a row of the same candidate
        # elsewhere in the batch (a popular item bought twice) is not scored as its negative
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.task = tfrs.tasks.Retrieval(temperature=temperature, remove_accidental_hits=self.remove_accidental_hits)

    def _encode(self, features: dict, embedded: dict, names: list[str], tower: list) -> tf.Tensor:
        parts = [embedded[n] if n in embedded else tf.cast(features[n], self.compute_dtype)[:, None] for n in names]
        x = tf.concat(parts, axis=1)
        for layer in tower:
            x = layer(x)
        return tf.cast(x, tf.float32)

    def query_embedding(self, features: dict) -> tf.Tensor:
        return self._encode(features, self.embeddings(features), self.query_features, self.query_tower)

    def candidate_embedding(self, features: dict) -> tf.Tensor:
        return self._encode(features, self.embeddings(features), self.candidate_features, self.candidate_tower)

    def call(self, features: dict, training: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
        embedded = self.embeddings(features)
        return (self._encode(features, embedded, self.query_features, self.query_tower),
                self._encode(features, embedded, self.candidate_features, self.candidate_tower))

    def compute_loss(self, features: dict, training: bool = False) -> tf.Tensor:
        query, candidate = self(features, training=training)
        weight = tf.cast(features[LABEL_KEY], tf.float32)
        ids = features[self.candidate_features[0]]
        probability = None
        if self._log_q is not None:
            # P(id) in the batch; TFRS subtracts log P, clipping P to <= 1, so both pools are scaled by 1/B:
            # a drawn ID's expected count (N / IDs) / B against an in-batch candidate's B * P(id) / B
            clipped = tf.minimum(ids, tf.shape(self._log_q, out_type=tf.int64)[0] - 1)
            probability = tf.exp(tf.gather(self._log_q, clipped))
        if self.uniform_negatives and training:
            drawn = tf.random.uniform([self.uniform_negatives], 0, self.candidate_ids, dtype=tf.int64)
            candidate = tf.concat([candidate, self.candidate_embedding({self.candidate_features[0]: drawn})], 0)
            if probability is not None:
                per_id = self.uniform_negatives / self.candidate_ids / tf.cast(tf.shape(ids)[0], tf.float32)
                probability = tf.concat([probability, tf.fill([self.uniform_negatives], per_id)], 0)
            ids = tf.concat([ids, drawn], 0)
        total = self.task(query, candidate, sample_weight=weight, candidate_sampling_probability=probability,
                          candidate_ids=ids if self.remove_accidental_hits else None, compute_metrics=False)
        return total / tf.maximum(tf.reduce_sum(weight), 1.0)

    def get_config(self):
        return {"embeddings": tf.keras.layers.serialize(self.embeddings), "query_features": self.query_features,
                "candidate_features": self.candidate_features, "tower_layers": self.tower_layers,
                "grad_accum_steps": self.grad_accum_steps, "temperature": self.temperature,
                "uniform_negatives": self.uniform_negatives, "candidate_ids": self.candidate_ids,
                "remove_accidental_hits": self.remove_accidental_hits, "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**{**config, "embeddings": tf.keras.layers.deserialize(config["embeddings"])})


@register
class ItemToItemModel(tf.keras.Model):
    """Item-to-item retrieval (EASE, fitted in closed form by recpipe.trainers.item_to_item): a query's score for
    every candidate ID is its earlier clicks times the item-to-item weights B. No gradients train it:
    `recpipe train` fills its weights. Where the query lists what the user had before (`history`, a multivalent
    query feature in the candidate's table), the request carries it: the model holds B ([candidate IDs,
    candidate IDs]) and sums the rows of the history's IDs. Otherwise the request names the user (the query
    key) and the model holds every user's scores ([user IDs, candidate IDs]), as a two-tower model holds a
    user's embedding. A query without earlier clicks (an empty history; a user the fit knew no click of)
    scores the candidates by popularity (`base`, their train clicks over the largest); with clicks, `base`
    times recpipe.trainers.item_to_item.TIE orders only near-equal scores.

    Args:
        query_key: the sparse feature naming the user (its IDs index `user_scores`' rows).
        candidate_feature: the candidate's ID feature (its IDs index the scores' columns).
        users: rows of the query key's table.
        candidates: rows of the candidate feature's table.
        history: the query's history feature, or None (score by the query key).
        tie: base's weight for a query with earlier clicks.
    """

    def __init__(self, query_key: str, candidate_feature: str, users: int, candidates: int,
                 history: Optional[str] = None, tie: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.query_key, self.candidate_feature, self.history = query_key, candidate_feature, history
        self.users, self.candidates, self.tie = int(users), int(candidates), float(tie)
        if history is None:
            self.user_scores = self.add_weight(name="user_scores", shape=(self.users, self.candidates),
                                               dtype="float32", initializer="zeros", trainable=False)
        else:
            self.item_weights = self.add_weight(name="item_weights", shape=(self.candidates, self.candidates),
                                                dtype="float32", initializer="zeros", trainable=False)
            self.base = self.add_weight(name="base", shape=(self.candidates,), dtype="float32",
                                        initializer="zeros", trainable=False)

    @property
    def query_input(self) -> str:
        """The one feature a query is scored from: the history, or the query key."""
        return self.history or self.query_key

    def id_scores(self, features: dict) -> tf.Tensor:
        """[rows, candidate IDs] float32: each row's score of every ID of the candidate feature."""
        if self.history is None:
            return tf.gather(self.user_scores, features[self.query_key])
        listed = features[self.history]  # RaggedTensor of candidate IDs
        summed = tf.reduce_sum(tf.gather(self.item_weights, listed), axis=1)
        weight = tf.where(listed.row_lengths() > 0, self.tie, 1.0)[:, None]
        return summed + weight * self.base[None, :]

    def call(self, features: dict, training: bool = False) -> tf.Tensor:
        return self.id_scores(features)

    def get_config(self):
        return {"query_key": self.query_key, "candidate_feature": self.candidate_feature, "users": self.users,
                "candidates": self.candidates, "history": self.history, "tie": self.tie, "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def embedding_layer(cfg: Config, artifact: TransformArtifact, names: Optional[set[str]] = None,
                    one_wide: Optional[bool] = None, name: str = "embeddings") -> SparseEmbeddings:
    """The SparseEmbeddings of the config's sparse features (those in `names`, if given): one table per
    owning feature, rows from the artifact, width from the config (1 for logistic regression and for
    a wide logit's tables)."""
    one_wide = cfg.model.type == "logistic" if one_wide is None else one_wide
    features = [{"name": f.name, "table": cfg.table_owner(f).name, "multivalent": f.multivalent,
                 "combiner": f.combiner} for f in cfg.features.sparse if names is None or f.name in names]
    used = {f["table"] for f in features}
    tables = {name: {"rows": rows, "dim": 1 if one_wide else embedding_dim(cfg, cfg.sparse_by_name[name])}
              for name, rows in artifact.table_sizes().items() if name in used}
    return SparseEmbeddings(tables, features, dedup=cfg.train.tuning.dedup_ids, name=name)


def table_shapes(cfg: Config, artifact: TransformArtifact) -> set[tuple[int, int]]:
    """Every shape (rows, width) an embedding table of this config can have, as embedding_layer makes it:
    at its width, or one wide (logistic regression, a wide logit). What the PS strategy shards
    (recpipe.trainers.strategies.ps.TablePartitioner). Layers only: no variable is created."""
    return {(t["rows"], t["dim"]) for one_wide in (False, True)
            for t in embedding_layer(cfg, artifact, one_wide=one_wide).table_specs.values()}


def _interaction(cfg: Config) -> Optional[tf.keras.layers.Layer]:
    m = cfg.model
    if m.type == "dcn_v2":
        return CrossStack(m.cross_layers, m.low_rank, name="cross_stack")
    if m.type == "dlrm":
        dim = embedding_dim(cfg, cfg.features.sparse[0])  # the config checks DLRM has one width
        return DotInteractionBlock(m.bottom_layers, dim, name="dot_interaction")
    return None  # logistic


def build_model(cfg: Config, artifact: TransformArtifact) -> tf.keras.Model:
    t = cfg.train.tuning  # how to compute, not what: changing these never changes the weights' layout
    m = cfg.model
    if m.type == "auto":
        raise TrainError("model.type auto names no model to build: `recpipe train` trains its candidates and keeps "
                         "one (recpipe.trainers.selection); build from a config that names its type")
    if m.type == "item_to_item":
        key = query_key_feature(cfg)
        if key is None:
            raise TrainError("model.type item_to_item: no query key names the user (model.query_key, or a "
                             "single-valued sparse first query feature)")
        sizes = artifact.table_sizes()
        return ItemToItemModel(key, m.candidate_features[0], sizes[cfg.table_owner(cfg.sparse_by_name[key]).name],
                               sizes[cfg.table_owner(cfg.sparse_by_name[m.candidate_features[0]]).name],
                               history=history_feature(cfg), tie=ITEM_TO_ITEM_TIE, name="item_to_item_retrieval")
    if m.task == "retrieval":
        return RetrievalModel(embedding_layer(cfg, artifact, {*m.query_features, *m.candidate_features}),
                              m.query_features, m.candidate_features, m.tower_layers,
                              grad_accum_steps=t.grad_accum_steps, temperature=m.temperature,
                              candidate_log_q=candidate_log_q(cfg, artifact) if logq_correction(cfg) else None,
                              uniform_negatives=m.uniform_negatives,
                              candidate_ids=known_ids(cfg, artifact, m.candidate_features[0]),
                              remove_accidental_hits=m.remove_accidental_hits,
                              name="two_tower_retrieval")
    return RankingModel(embedding_layer(cfg, artifact), _interaction(cfg),
                        deep_layers=[] if m.type == "logistic" else m.deep_layers,
                        dense_features=[d.name for d in cfg.features.dense], jit_dense=t.jit_dense,
                        grad_accum_steps=t.grad_accum_steps,
                        wide=embedding_layer(cfg, artifact, one_wide=True, name="wide") if m.wide else None,
                        dropout=m.dropout, embedding_l2=cfg.train.embedding_l2, name=f"{m.type}_ranking")


def compiled_model(cfg: Config, artifact: TransformArtifact, optimizer: tf.keras.optimizers.Optimizer,
                   steps_per_execution: int = 1) -> tf.keras.Model:
    """build_model compiled with `optimizer`, every variable and optimizer slot created: a restore
    then checks them all, and a step does not trace twice (once creating the slots, once without).
    Call it inside the precision policy (and strategy scope) the model trains under."""
    model = build_model(cfg, artifact)
    model.compile(optimizer=optimizer, steps_per_execution=steps_per_execution)
    model(dummy_batch(cfg))
    model.optimizer.build(model.trainable_variables)
    return model




def candidate_log_q(cfg: Config, artifact: TransformArtifact) -> np.ndarray:
    """log P(candidate ID) in the train split for every ID of the first candidate feature's table:
    vocabulary counts / their total; the OOV buckets and free slots share the rarest count (their true
    counts are not kept)."""
    owner = cfg.table_owner(cfg.sparse_by_name[cfg.model.candidate_features[0]])
    counts = np.asarray(artifact.vocab_counts.get(owner.name, []), dtype=np.float64)
    rows = artifact.table_sizes()[owner.name]
    floor = counts[counts > 0].min() if (counts > 0).any() else 1.0
    full = np.concatenate([np.where(counts > 0, counts, floor), np.full(rows - len(counts), floor)])
    return np.log(full / full.sum())


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
