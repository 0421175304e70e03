"""The models' building blocks as Keras-serialisable layers (registered under package "recpipe").

SparseEmbeddings   every sparse feature's lookup in its (possibly shared) table; multivalent
                   features pooled; optional unique-then-gather ID dedup
TableEmbedding     a Keras Embedding whose table is initialised in place, a block of rows at a time
Cross              TFRS's DCN-v2 cross layer, computing in the mixed-precision policy's compute dtype
CrossStack         DCN-v2's interaction: cross layers over [embeddings, dense]
pairwise_dots      DLRM's dot products of every pair of distinct features
DotInteractionBlock  DLRM's interaction: bottom MLP on the dense features, pairwise dot products
An interaction block maps (list of embedded features, dense matrix or None) to the top MLP's input.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from recpipe.trainers import row_reads

__all__ = ["flat_ids", "ids_by_table", "pooled_features", "mlp", "fill_rows", "TableEmbedding", "SparseEmbeddings",
           "Cross", "CrossStack", "pairwise_dots", "DotInteractionBlock"]

register = tf.keras.utils.register_keras_serializable(package="recpipe")


def flat_ids(ids) -> tf.Tensor:
    """Every ID of a feature's batch: a ragged list feature's flat values, else the tensor itself."""
    return ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids


def ids_by_table(features: list[dict], batch: dict) -> dict[str, list[tuple[str, tf.Tensor]]]:
    """(feature name, flat IDs) of every sparse feature present in `batch`, grouped by the
    (possibly shared) table it reads. `features`: SparseEmbeddings' feature descriptions."""
    grouped: dict[str, list] = {}
    for f in features:
        if f["name"] in batch:
            grouped.setdefault(f["table"], []).append((f["name"], flat_ids(batch[f["name"]])))
    return grouped


def pooled_features(present: list[dict], features: dict, vectors: dict, dtype) -> dict[str, tf.Tensor]:
    """Each present feature's embedding in `dtype`: its looked-up rows (`vectors`: one per flat ID), a
    multivalent feature's pooled by its combiner (sum, or mean over its IDs)."""
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
    return {k: tf.cast(v, dtype) for k, v in out.items()}


def mlp(widths: list[int], name: str, dropout: float = 0.0) -> list[tf.keras.layers.Layer]:
    """ReLU layers of the given widths, each followed by dropout (training only) when dropout > 0."""
    layers: list[tf.keras.layers.Layer] = []
    for i, w in enumerate(widths):
        layers.append(tf.keras.layers.Dense(w, activation="relu", name=f"{name}_{i}"))
        if dropout:
            layers.append(tf.keras.layers.Dropout(dropout, name=f"{name}_{i}_dropout"))
    return layers


# Rows of a table initialised at once (8 MiB of a 32-wide float32 table): the initialiser's temporaries are this
# many rows, never the whole table.
ROWS_AT_ONCE = 65_536


def fill_rows(table, initializer, rows_at_once: int = ROWS_AT_ONCE) -> None:
    """Set every row of an embedding table from `initializer`, in place, `rows_at_once` rows at a time, each
    block drawn on the device of the variable (or shard) holding it.

    Drawing a whole table at once holds about three copies of it beside the variable (RandomUniform's draw,
    its scaling and its shift, each a new tensor in eager mode), and oneDNN's CPU allocator keeps the freed
    blocks for the process's life: 2.2x the largest table of resident memory that held nothing.

    Args:
        table: a 2-D variable, or a ShardedVariable (its shards are filled one after another).
        initializer: a Keras initializer; each block is drawn as the partition of its rows
            (partition_shape/partition_offset), so blocks differ and the initializer is not reused as a whole.
        rows_at_once: rows per block.

    Raises:
        ValueError: rows_at_once < 1.
    """
    if rows_at_once < 1:
        raise ValueError(f"rows_at_once {rows_at_once}: at least 1")
    offset = 0
    for shard in getattr(table, "variables", [table]):
        rows, width = (int(d) for d in shard.shape)
        with tf.device(shard.device):
            for lo in range(0, rows, rows_at_once):
                n = min(rows_at_once, rows - lo)
                block = initializer((n, width), shard.dtype, partition_shape=(n, width),
                                    partition_offset=(offset + lo, 0))
                # a scatter, not shard[lo:hi].assign: slicing reads the variable first, and a write while
                # that read is alive copies the whole table (copy on write) at every block
                shard.scatter_update(tf.IndexedSlices(block, tf.range(lo, lo + n, dtype=tf.int64)))
        offset += rows


@register
class TableEmbedding(tf.keras.layers.Embedding):
    """tf.keras.layers.Embedding whose table is created as zeros (one buffer, which the variable takes
    over) and then drawn from its initializer in place, a block of rows at a time (fill_rows). Its
    variables, their names and its checkpoint keys are Embedding's."""

    def build(self, input_shape=None):
        initializer = self.embeddings_initializer
        self.embeddings_initializer = tf.keras.initializers.Zeros()
        try:
            super().build(input_shape)
        finally:
            self.embeddings_initializer = initializer
        fill_rows(self.embeddings, initializer)


@register
class SparseEmbeddings(tf.keras.layers.Layer):
    """Looks up every sparse feature in its (possibly shared) table; multivalent ones are pooled.

    tables: {table: {"rows": n, "dim": d}}; features: [{"name", "table", "multivalent", "combiner"}].
    dedup=True (unique-then-gather): the IDs of every feature that reads one table are
    concatenated, made unique, looked up once and gathered back, so the table is read (and its
    gradient carries) one row per distinct ID in the batch instead of one per occurrence; the rows read are
    noted for the optimizer (recpipe.trainers.row_reads), which writes them back updated.
    Tables stay float32 under mixed precision; outputs are cast to the compute dtype.
    """

    def __init__(self, tables: dict, features: list, dedup: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.table_specs, self.feature_specs, self.dedup = tables, features, dedup
        self.tables = {name: TableEmbedding(t["rows"], t["dim"], dtype="float32", name=f"emb_{name}")
                       for name, t in tables.items()}

    def call(self, features: dict) -> dict[str, tf.Tensor]:
        present = [f for f in self.feature_specs if f["name"] in features]  # e.g. a candidate-only batch
        vectors = self._lookup_unique(features) if self.dedup else {
            f["name"]: self.tables[f["table"]](flat_ids(features[f["name"]])) for f in present}
        return pooled_features(present, features, vectors, self.compute_dtype)

    def _lookup_unique(self, features: dict) -> dict[str, tf.Tensor]:
        vectors = {}
        for table, named in ids_by_table(self.feature_specs, features).items():
            names, flats = [n for n, _ in named], [ids for _, ids in named]
            unique, index = tf.unique(tf.concat(flats, axis=0) if len(flats) > 1 else flats[0])
            embedding = self.tables[table]
            read = embedding(unique)
            row_reads.record(embedding.embeddings, unique, read)  # for the optimizer (row_reads)
            rows = tf.gather(read, index)
            parts = tf.split(rows, tf.stack([tf.shape(x)[0] for x in flats]), num=len(flats)) \
                if len(flats) > 1 else [rows]
            vectors.update(zip(names, parts))
        return vectors

    def get_config(self):
        return {**super().get_config(), "tables": self.table_specs, "features": self.feature_specs,
                "dedup": self.dedup}


@register
class Cross(tfrs.layers.dcn.Cross):
    """`tfrs.layers.dcn.Cross` whose matmuls run in the layer's compute dtype. TFRS 0.7.7 builds the
    layer's Dense sublayers with `dtype=self.dtype`, the *variable* dtype, so under `mixed_bfloat16`
    they compute in float32 and the cross layers, half the default model's step, gained nothing from
    bf16. Here they take the layer's own policy: bfloat16 compute, float32 variables. The sublayers,
    their variables and their checkpoint names are TFRS's, so checkpoints of either load in the other."""

    def build(self, input_shape):
        super().build(input_shape)
        policy = self.dtype_policy
        for name in ("_dense", "_dense_u", "_dense_v"):
            dense = getattr(self, name, None)
            if dense is not None:  # not built yet, so its variables are made under the new policy
                setattr(self, name, tf.keras.layers.Dense.from_config({**dense.get_config(), "dtype": policy}))


@register
class CrossStack(tf.keras.layers.Layer):
    """DCN-v2: x0 = [embeddings..., dense]; x_{l+1} = x0 * (W x_l + b) + x_l for each cross layer
    (low_rank: W = U V with rank low_rank)."""

    def __init__(self, num_layers: int, low_rank: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.num_layers, self.low_rank = num_layers, low_rank
        self.cross = [Cross(projection_dim=low_rank, name=f"cross_{i}") for i in range(num_layers)]

    def call(self, embedded: list, dense: Optional[tf.Tensor] = None) -> tf.Tensor:
        x0 = tf.concat([*embedded, dense] if dense is not None else embedded, axis=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return x

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, "low_rank": self.low_rank}


def pairwise_dots(features: list) -> tf.Tensor:
    """DLRM's interaction: the dot product of every pair of distinct features.

    Args:
        features: F tensors [B, D] of one width.

    Returns:
        [B, F(F-1)/2]: for i > j, in row-major order of the lower triangle, <features[i], features[j]>.
    """
    n = len(features)
    rows, cols = np.tril_indices(n, -1)
    # [B, F, D] by concat and reshape, whose gradient is one split: 0.91x the interaction's time with
    # tf.stack, whose gradient unstacks with strided copies
    width = features[0].shape[-1] or tf.shape(features[0])[-1]
    stacked = tf.reshape(tf.concat(features, axis=1), [-1, n, width])
    return _lower_triangle_dots(stacked, rows * n + cols, _symmetric_positions(rows, cols, n))


def _symmetric_positions(rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """Where each entry of a symmetric n x n matrix comes from in a vector of its pairs.

    Args:
        rows, cols: the pairs' entries (pair k is (rows[k], cols[k])), one per unordered pair off the diagonal.
        n: the matrix's size.

    Returns:
        [n * n] int32, row-major: for entries (i, j) and (j, i) the index of their pair; on the diagonal the
        pair count (the index of a zero appended after the pairs).
    """
    positions = np.full(n * n, len(rows), np.int32)
    pair = np.arange(len(rows), dtype=np.int32)
    positions[rows * n + cols] = pair
    positions[cols * n + rows] = pair
    return positions


def _lower_triangle_dots(stacked: tf.Tensor, pairs: np.ndarray, positions: np.ndarray) -> tf.Tensor:
    """Chosen entries of every example's product matrix, with a gradient of one batched matmul.

    For P = X X^T and G the gradient of P, dL/dX = (G + G^T) X. Only the pairs' entries of G are non-zero,
    so G + G^T is gathered straight from the pairs' gradients: one batched matmul, where autodiff of the
    product runs two (one per operand) and adds them, and scatters the pairs' gradients back into G first.
    On the embedding-heavy DLRM's step (27 features) the batched matmuls' kernel time halves (2.2 to 1.1 ms).

    Args:
        stacked: X, [B, F, D].
        pairs: [P] row-major entries of the F x F product, each (i, j) with i != j, no pair twice.
        positions: _symmetric_positions of those pairs.

    Returns:
        [B, P]: the pairs' dot products.
    """
    n = stacked.shape[1]

    @tf.custom_gradient
    def dots(x):
        products = tf.reshape(tf.matmul(x, x, transpose_b=True), [-1, n * n])
        # the pairs' columns, gathered as rows of the transpose: a copy of whole rows rather than of single
        # floats (GatherV2 on axis 1), 0.93x the interaction + top MLP step of the embedding-heavy DLRM
        out = tf.transpose(tf.gather(tf.transpose(products), pairs))
        # the tape calls grad outside the layer's name scope: its ops are named as the tape names the
        # gradients of the layer's other ops (recpipe.bench.op_profile groups kernels by these names)
        scope = f"gradient_tape/{tf.get_current_name_scope()}/".replace("//", "/")

        def grad(upstream):
            with tf.name_scope(scope):
                zero = tf.zeros([1, tf.shape(upstream)[0]], upstream.dtype)
                by_pair = tf.concat([tf.transpose(upstream), zero], axis=0)  # [P + 1, B]
                symmetric = tf.reshape(tf.transpose(tf.gather(by_pair, positions)), [-1, n, n])
                return tf.matmul(symmetric, x)
        return out, grad
    return dots(stacked)


@register
class DotInteractionBlock(tf.keras.layers.Layer):
    """DLRM: a bottom MLP maps the dense features to the embedding width; the dot products of every pair
    of distinct features (it and every embedding, pairwise_dots) are concatenated with its output, as in
    DLRM's reference model, TorchRec and TFRS' DotInteraction."""

    def __init__(self, bottom_layers: list, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.bottom_layers, self.dim = list(bottom_layers), dim
        self.bottom = mlp([*bottom_layers, dim], "bottom")

    def call(self, embedded: list, dense: Optional[tf.Tensor] = None) -> tf.Tensor:
        bottom = dense if dense is not None else tf.zeros([tf.shape(embedded[0])[0], 1], self.compute_dtype)
        for layer in self.bottom:
            bottom = layer(bottom)
        return tf.concat([bottom, pairwise_dots([bottom, *embedded])], axis=1)

    def get_config(self):
        return {**super().get_config(), "bottom_layers": self.bottom_layers, "dim": self.dim}
