"""Table rows that a step's forward pass has read, for the step's optimizer to reuse.

With ID dedup, SparseEmbeddings reads each table once per step at the batch's distinct IDs, and the table's
gradient has exactly those IDs as its indices. Adagrad then needs the same rows again to write them back
updated; reading them a second time is a random gather over the table. `record` notes the forward read on
the table variable and `rows_read` hands it back to the optimizer when the gradient's indices are that very
read's IDs (the same tensor of the same traced function), so the rows are the ones the step has not yet
updated. Anything else (another function, concatenated or re-deduplicated indices, indices captured from
outside the function, eager execution) gets None and reads the rows itself.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

__all__ = ["record", "rows_read"]

_ATTR = "_recpipe_rows_read"


def record(table: tf.Variable, ids: tf.Tensor, rows: tf.Tensor) -> None:
    """Note that `rows` is `table` gathered at `ids`, read in the function being traced.

    Args:
        table: the table variable read. Under a distribution strategy (sharded or mirrored tables, shared
            updates) nothing is noted.
        ids: the row indices read, [N].
        rows: the rows read, [N, width], in the table's dtype (a cast copy is not noted).
    """
    if tf.inside_function() and not tf.distribute.has_strategy() and rows.dtype == table.dtype:
        setattr(table, _ATTR, (ids, rows))


def rows_read(table: tf.Variable, indices: tf.Tensor) -> Optional[tf.Tensor]:
    """The rows of `table` at `indices` as this function's forward pass read them, if it did.

    Args:
        table: the table variable being updated.
        indices: its gradient's indices: the recorded IDs, or TensorFlow's flattening (Reshape) of them
            that a gather's gradient carries.

    Returns:
        The recorded rows, or None when `indices` is not the recorded read's IDs or there is none.
    """
    got = getattr(table, _ATTR, None)
    if got is None or not tf.inside_function() or not tf.is_symbolic_tensor(indices):  # a captured value: no op
        return None
    ids, rows = got
    source = indices.op.inputs[0] if indices.op.type == "Reshape" else indices
    return rows if source is ids else None
