"""Pruned served models: drop the embedding rows of vocabulary values not seen in the last D days.

The transform artifact of a day's run keeps, per vocabulary slot, the last day its value was seen
(recpipe.pipeline.lifecycle). `prune_vocabularies(artifact, unseen_days)` keeps the values seen on the
artifact's day or the D - 1 days before it (a value whose last day is unknown is kept), and
compacts each vocabulary: the kept values, in ID order, become IDs 0..K-1, free slots are dropped,
and the OOV buckets follow at K.. as they followed the slots at V.. (an OOV token's bucket is the
same FarmHash64 % oov_buckets, so its row is the trained one). A pruned value is then an unknown
token: the served graph maps it to its OOV bucket, as the Beam job maps a value it never admitted.

`prune_model(model, rows)` swaps each affected Keras Embedding table (deep and wide) for one
holding only the kept rows, in the new order. `pruned_records(...)` transforms the eval sample's
raw rows with the pruned vocabularies (the batch path of the one transform) as the skew check's
reference, and first checks them against the Beam job's own records: every kept value's ID must be
the Beam job's ID renumbered, and every pruned one must land in an OOV bucket.
`pruned_candidates(...)` does the same for a retrieval index read from the data by trained ID:
a candidate whose own value was pruned leaves the index, and the others' attribute IDs are
renumbered (a pruned attribute value becomes its OOV bucket, as the served graph maps it).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import tensorflow as tf

from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import canonicalize
from recpipe.common.days import day_number
from recpipe.common.errors import RecpipeError
from recpipe.features.batch_transform import BatchTransform
from recpipe.features.hashing import hash_buckets
from recpipe.features.record_codec import Ragged
from recpipe.trainers.evaluation.candidates import Candidates

__all__ = ["PruneError", "Pruning", "prune_vocabularies", "prune_model", "pruned_records", "pruned_candidates"]

class PruneError(RecpipeError, ValueError):
    pass


@dataclass(frozen=True)
class Pruning:
    artifact: TransformArtifact     # what the served graph uses: the compacted vocabularies
    original: TransformArtifact     # what the model was trained with
    rows: dict[str, np.ndarray]     # table -> the trained table's rows the served table keeps, in order
    id_map: dict[str, np.ndarray]   # table -> trained ID -> served ID (-1: pruned, now an OOV token)
    report: dict                    # per table: slots, kept, pruned, free; the cut-off day


def prune_vocabularies(artifact: TransformArtifact, unseen_days: int) -> Pruning:
    """The artifact with every vocabulary's values not seen in the last `unseen_days` days (the
    artifact's own day included) removed and the rest compacted; see the module docstring."""
    if unseen_days < 1:
        raise PruneError(f"--prune-unseen-days {unseen_days}: expected a number of days >= 1")
    if artifact.day is None:
        raise PruneError("--prune-unseen-days: the model's transform artifact has no day; run `recpipe preprocess` "
                         "with --day (or on dt=YYYY-MM-DD partitions) so the vocabularies know when each value was "
                         "last seen")
    cutoff = day_number(artifact.day) - unseen_days + 1  # kept: last seen on cutoff .. day
    pruned = copy.copy(artifact)
    pruned.vocabularies, pruned.vocab_counts, pruned.vocab_last_seen = {}, {}, {}
    rows, id_map, report = {}, {}, {"unseen_days": unseen_days, "day": artifact.day, "tables": {}}
    for name, values in artifact.vocabularies.items():
        owner = artifact.config.sparse_by_name[name]
        last_seen = list(artifact.vocab_last_seen.get(name) or [None] * len(values))
        counts = list(artifact.vocab_counts.get(name) or [0] * len(values))
        keep = [i for i, v in enumerate(values) if v is not None and (last_seen[i] is None or last_seen[i] >= cutoff)]
        slots, oov = len(values), owner.vocab.oov_buckets
        pruned.vocabularies[name] = [values[i] for i in keep]
        pruned.vocab_counts[name] = [counts[i] for i in keep]
        pruned.vocab_last_seen[name] = [last_seen[i] for i in keep]
        rows[name] = np.concatenate([np.asarray(keep, np.int64), slots + np.arange(oov, dtype=np.int64)])
        mapping = np.full(slots + oov, -1, np.int64)
        mapping[rows[name]] = np.arange(len(rows[name]), dtype=np.int64)
        id_map[name] = mapping
        live = sum(v is not None for v in values)
        report["tables"][name] = {"slots": slots, "kept": len(keep), "pruned": live - len(keep),
                                  "free_slots_dropped": slots - live, "rows_before": slots + oov,
                                  "rows_after": len(keep) + oov}
    return Pruning(pruned, artifact, rows, id_map, report)


def prune_model(model: tf.keras.Model, rows: dict[str, np.ndarray]) -> int:
    """Swap, in place, every embedding table of `model` named after a pruned vocabulary (its deep and
    its wide SparseEmbeddings) for one holding rows[table] of it, in that order. Returns the tables swapped."""
    from recpipe.trainers.layers import SparseEmbeddings  # the trainer's layer: serving reads the trained model's layout
    swapped = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):  # noqa: SLF001
        if not isinstance(layer, SparseEmbeddings):
            continue
        tables = dict(layer.tables)
        for name, keep in rows.items():
            if name not in tables:
                continue
            old = tables[name]
            weights = old.embeddings.numpy()
            if len(keep) and int(keep.max()) >= weights.shape[0]:
                raise PruneError(f"table {name!r}: {weights.shape[0]} trained rows, but the artifact names row "
                                 f"{int(keep.max())}; the model and its transform artifact disagree")
            new = tf.keras.layers.Embedding(len(keep), weights.shape[1], dtype="float32", name=old.name)
            new.build((None,))
            new.embeddings.assign(weights[keep])
            tables[name] = new
            swapped += 1
        layer.tables = tables  # given anew: an in-place edit of a tracked dict cannot be saved
        layer.table_specs = {n: {**s, "rows": int(len(rows[n]))} if n in rows else s
                             for n, s in layer.table_specs.items()}
    return swapped


def _flat(x) -> np.ndarray:
    x = x.flat_values if isinstance(x, (tf.RaggedTensor, Ragged)) else x
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x, np.int64)


def pruned_records(pruning: Pruning, sample: pa.Table, beam_records: dict) -> dict:
    """The eval sample's raw rows transformed with the pruned vocabularies, as the trainer's model
    takes them; checked against the Beam job's records of the same rows first (module docstring)."""
    cfg = pruning.artifact.config
    records = dict(BatchTransform(pruning.artifact)(canonicalize(sample, cfg)))
    for f in cfg.features.sparse:
        table = cfg.table_owner(f).name
        if table not in pruning.id_map or f.name not in beam_records:
            continue
        before, after = _flat(beam_records[f.name]), _flat(records[f.name])
        if before.shape != after.shape:
            raise PruneError(f"feature {f.name!r}: {after.shape[0]} IDs from the raw eval sample, {before.shape[0]} "
                             f"in the Beam job's records of it")
        expected = pruning.id_map[table][before]
        kept_vocab = len(pruning.artifact.vocabularies[table])
        wrong = np.flatnonzero(np.where(expected >= 0, after != expected, after < kept_vocab))
        if len(wrong):
            raise PruneError(f"feature {f.name!r}: the pruned transform gives ID {int(after[wrong[0]])} where the Beam "
                             f"job wrote {int(before[wrong[0]])} (eval sample item {int(wrong[0])}); they must agree")
    for name, value in beam_records.items():
        if name not in records:
            records[name] = value
    return {k: _tensor(v) for k, v in records.items()}


def _tensor(v) -> tf.Tensor | tf.RaggedTensor:
    if isinstance(v, (tf.Tensor, tf.RaggedTensor)):
        return v
    if isinstance(v, Ragged):
        return tf.RaggedTensor.from_row_lengths(v.values, v.row_lengths, validate=False)
    return tf.constant(v)


def _served_ids(pruning: Pruning, table: str, ids: np.ndarray) -> np.ndarray:
    """Trained IDs of `table` -> the IDs the pruned served graph gives the same values: kept values
    and OOV buckets renumbered, a pruned value in its OOV bucket (FarmHash64 % buckets after the
    kept values)."""
    ids = np.asarray(ids, np.int64)
    if table not in pruning.id_map:
        return ids
    out = pruning.id_map[table][ids]
    gone = np.flatnonzero(out < 0)
    if len(gone):
        values = pa.array([pruning.original.vocabularies[table][i] for i in ids[gone].tolist()], pa.string())
        buckets = pruning.original.config.sparse_by_name[table].vocab.oov_buckets
        out[gone] = len(pruning.artifact.vocabularies[table]) + hash_buckets(values, buckets)
    return out


def pruned_candidates(pruning: Pruning, candidate_features: list[str], candidates: Candidates) -> Candidates:
    """A retrieval index read from the data (by trained ID of its first candidate feature, attributes
    from the candidate's first row) as the pruned export serves it: the candidates whose first
    feature's value was pruned are left out (not recommended), and every kept candidate's features
    are renumbered with _served_ids."""
    cfg = pruning.original.config
    tables = {n: cfg.table_owner(cfg.sparse_by_name[n]).name for n in candidate_features}
    first = candidate_features[0]
    keep = np.flatnonzero(pruning.id_map[tables[first]][candidates.ids] >= 0) if tables[first] in pruning.id_map \
        else np.arange(len(candidates.ids))
    features = {}
    for name, values in candidates.features.items():
        kept = [values[i] for i in keep.tolist()]
        if cfg.sparse_by_name[name].multivalent:  # an ID array per candidate
            lengths = [len(v) for v in kept]
            flat = np.concatenate(kept).astype(np.int64) if kept else np.zeros(0, np.int64)
            features[name] = np.split(_served_ids(pruning, tables[name], flat), np.cumsum(lengths)[:-1])
        else:
            features[name] = _served_ids(pruning, tables[name], np.asarray(kept, np.int64)).tolist()
    return Candidates(ids=_served_ids(pruning, tables[first], candidates.ids[keep]), features=features)
