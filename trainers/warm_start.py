"""Warm start: initialise a new model from a previous day's model dir.

Embedding rows follow the values: a vocabulary table's row for a value is copied from the row that
held the same value yesterday (kept values keep their IDs, so that is the same row; a slot freed by
eviction and reused by a new value starts fresh, as do newly appended values and the OOV buckets).
A hashed table of unchanged size is copied row for row. Every other weight is copied when its shape
is unchanged; the optimizer starts fresh.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable

import numpy as np
import tensorflow as tf

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config
from recpipe.common.errors import RecpipeError
from recpipe.trainers.model_dir import ModelDir

__all__ = ["WarmStartError", "warm_start", "apply_warm_start", "features_difference"]


class WarmStartError(RecpipeError, ValueError):
    pass


# Rows a table's warm start copies at once: it holds yesterday's table (read from the checkpoint) and this many
# of its rows beside today's, never a second copy of either table.
ROWS_AT_ONCE = 65_536
_TABLE_WEIGHT = re.compile(r"/emb_([A-Za-z][A-Za-z0-9_]*)/")  # SparseEmbeddings names its tables emb_<owner>


def _row_map(cfg: Config, prev: TransformArtifact, artifact: TransformArtifact, table: str, prev_rows: int,
             rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(today's rows, the previous model's rows) that stand for the same values."""
    if cfg.sparse_by_name[table].hash_buckets is not None:
        same = np.arange(min(prev_rows, rows))
        return same, same
    before = {v: i for i, v in enumerate(prev.vocabularies.get(table, [])) if v is not None}
    pairs = [(i, before[v]) for i, v in enumerate(artifact.vocabularies.get(table, [])) if v in before]
    today, earlier = (np.array(x, dtype=np.int64) for x in zip(*pairs)) if pairs else (np.zeros(0, np.int64),) * 2
    return today, earlier


# What a feature may change between the model warm-started from and this one: its vocabulary (the rows follow
# the values) and how a value is read (a list's separator, a dense value's fill and range rule).
_MAY_CHANGE = {"sparse": {"vocab", "separator"}, "dense": {"fill", "out_of_range"}}


def features_difference(before: Config, now: Config) -> str | None:
    """The first change between two configs' features that moves what a weight stands for (None: none).
    Weights pair by position: the embeddings and dense values are concatenated in the features' order, so
    two features swapped (or one renamed, or reading another column) give every cross and deep kernel's
    rows to other inputs, of the same shapes."""
    for kind, was, nowl in (("sparse", before.features.sparse, now.features.sparse),
                            ("dense", before.features.dense, now.features.dense)):
        if len(was) != len(nowl):
            return f"{len(was)} {kind} features there, {len(nowl)} here"
        for i, (a, b) in enumerate(zip(was, nowl)):
            da, db = ({k: v for k, v in dataclasses.asdict(f).items() if k not in _MAY_CHANGE[kind]} for f in (a, b))
            changed = [f"{k} {da[k]!r} there, {db[k]!r} here" for k in da if da[k] != db[k]]
            if changed:
                return f"features.{kind}[{i}] ({a.name!r} there): {'; '.join(changed)}"
    return None


def _checkpoint_keys(model: tf.keras.Model) -> dict[int, str]:
    """id of each of the model's variables -> its key in a checkpoint of tf.train.Checkpoint(model=...) of the same
    network: the object path breadth first from the model, as the checkpoint names it (the first path wins)."""
    view, keys, seen = tf.train.TrackableView(model), {}, {id(model)}
    queue = collections.deque([("model", model)])
    while queue:
        path, obj = queue.popleft()
        for name, child in view.children(obj).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{name.replace('.', '..').replace('/', '.S')}"  # escaped as the checkpoint does
            if isinstance(child, tf.Variable):
                keys[id(child)] = f"{child_path}/.ATTRIBUTES/VARIABLE_VALUE"
            else:
                queue.append((child_path, child))
    return keys


def _network(cfg: Config):
    """The model section but logQ correction, which weights the loss and not the network (a model trained before it
    defaulted to on saved it as false)."""
    return dataclasses.replace(cfg.model, logq_correction=None)


def warm_start(model: tf.keras.Model, cfg: Config, artifact: TransformArtifact, previous_dir: str,
               say: Callable[[str], None] = print) -> dict:
    """Copy weights of previous_dir's trained weights into `model` (built); return what was copied. The weights
    are read from the checkpoint one at a time (no second model is built: for a large table that held the
    previous model's weights beside today's, and its graph). A damaged checkpoint is skipped for the next
    older whole one, with a warning to `say`."""
    previous = ModelDir(previous_dir)
    prev_cfg, prev_art = previous.config(), previous.transform()
    if _network(prev_cfg) != _network(cfg):
        raise WarmStartError(f"{previous_dir}: its model section differs; warm start needs the same network")
    changed = features_difference(prev_cfg, cfg)
    if changed is not None:
        raise WarmStartError(f"{previous_dir}: its features differ from this config's: {changed}. Warm start pairs "
                             f"the weights by position, and the inputs of every cross and deep layer follow the "
                             f"features' order, so it needs the same features in the same order (their "
                             f"vocabularies may differ: rows follow the values); train this config from scratch")
    for table, new_rows in artifact.table_sizes().items():
        if table in prev_art.table_sizes() and cfg.sparse_by_name[table].hash_buckets is not None \
                and prev_art.table_sizes()[table] != new_rows:
            raise WarmStartError(f"{previous_dir}: hashed table {table!r} changed size "
                                 f"({prev_art.table_sizes()[table]} -> {new_rows}); IDs would not match")
    prefix = previous.whole_weights(lambda m: say(f"train: warm start: {m}"))
    reader = tf.train.load_checkpoint(prefix)
    shapes, keys = reader.get_variable_to_shape_map(), _checkpoint_keys(model)
    report = {"copied": 0, "rows_copied": {}, "skipped": []}
    for w in model.weights:
        key = keys.get(id(w))
        if key not in shapes:  # a weight of a table sharded over PS tasks has no key of its own
            report["skipped"].append(f"{w.name}: not in {prefix}" if key else f"{w.name}: no checkpoint path")
            continue
        shape = tuple(shapes[key])
        table_match = _TABLE_WEIGHT.search(w.name)  # a deep or a wide (one-wide) embedding table
        if table_match is None and shape == tuple(w.shape):
            w.assign(reader.get_tensor(key))
            report["copied"] += 1
        elif table_match is not None and shape[1:] == tuple(w.shape[1:]):
            table = table_match.group(1)
            today, earlier = _row_map(cfg, prev_art, artifact, table, shape[0], int(w.shape[0]))
            rows = reader.get_tensor(key)
            for lo in range(0, len(today), ROWS_AT_ONCE):  # in place, a slice of the kept rows at a time
                part = slice(lo, lo + ROWS_AT_ONCE)
                w.scatter_update(tf.IndexedSlices(tf.constant(rows[earlier[part]]), tf.constant(today[part])))
            del rows
            report["copied"] += 1
            report["rows_copied"][table] = int(len(today))
        else:
            report["skipped"].append(f"{w.name} {shape} -> {tuple(w.shape)}")
    if report["skipped"]:
        raise WarmStartError(f"{previous_dir}: weights that do not fit this model: {report['skipped'][:5]}")
    return report


def apply_warm_start(model: tf.keras.Model, cfg: Config, artifact: TransformArtifact, previous: str,
                     say: Callable[[str], None]) -> None:
    """Warm-start `model` from a previous model dir and say what was copied."""
    report = warm_start(model, cfg, artifact, previous, say)
    rows = ", ".join(f"{t}:{n}" for t, n in sorted(report["rows_copied"].items())[:6])
    say(f"train: warm start from {previous}: {report['copied']} weights copied (embedding rows kept: {rows}"
        f"{', ...' if len(report['rows_copied']) > 6 else ''})")
