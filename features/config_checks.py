"""The feature spec's semantic checks: what the types alone cannot say (unique names, columns a SavedModel
can take as inputs, crosses of single-valued features, retrieval towers, limits). Every error names the key."""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional

from recpipe.common.errors import ConfigError
from recpipe.features.schema import (MODEL_TYPES, Config, ModelSpec, SparseFeature, embedding_dim,
                                     list_separator, unread_model_keys)
from recpipe.features.schema import model_keys as keys_read_by

__all__ = ["validate", "check_model_keys"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# A raw column a feature reads becomes a SavedModel signature input of the same name, so it must be a
# valid TensorFlow op name (a column "user id" would fail at export, after all the training).
_COLUMN = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-/]*")


def _positive(value: Optional[float], path: str, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{path}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _check_feature_limits(cfg: Config) -> None:
    column_fed = {f.name for f in [*cfg.column_sparse, *cfg.features.dense]}
    dense, seen = {d.name for d in cfg.features.dense}, {}
    for i, own in enumerate(cfg.preprocess.features):
        path = f"preprocess.features[{i}]"
        if own.feature not in column_fed:
            raise ConfigError(f"{path}.feature: {own.feature!r} is not a feature read from a column "
                              f"({', '.join(sorted(column_fed))})")
        if own.feature in seen:
            raise ConfigError(f"{path}.feature: {own.feature!r} already has limits in {seen[own.feature]}")
        seen[own.feature] = path
        if own.max_presence_change is not None and not 0 < own.max_presence_change <= 1:
            raise ConfigError(f"{path}.max_presence_change: must be in (0, 1], got {own.max_presence_change}")
        if own.max_mean_shift is not None:
            if own.feature not in dense:
                raise ConfigError(f"{path}.max_mean_shift: {own.feature!r} is not a dense feature")
            _positive(own.max_mean_shift, f"{path}.max_mean_shift")


def validate(cfg: Config, model_keys: Optional[Iterable[str]] = None) -> Config:
    """Check a typed Config as a whole.

    Args:
        cfg: a Config whose fields already have their annotated types.
        model_keys: the keys the YAML's model mapping held, when known (see check_model_keys).

    Returns:
        `cfg` itself.

    Raises:
        ConfigError: the first problem found, naming its key (``features.sparse[2].cross``).
    """
    names: dict[str, str] = {}
    for kind in ("sparse", "dense"):
        for i, f in enumerate(getattr(cfg.features, kind)):
            path = f"features.{kind}[{i}]"
            if f.name in names:
                raise ConfigError(f"{path}.name: {f.name!r} is already used by {names[f.name]}")
            if not _NAME.fullmatch(f.name):
                raise ConfigError(f"{path}.name: {f.name!r} must be letters, digits and '_', starting with a letter")
            if kind == "sparse" and f.column is None and f.cross is None:
                raise ConfigError(f"{path}.column: required key is missing (or give cross: [...] for a crossed "
                                  f"feature)")
            if kind == "sparse" and f.column is not None and f.cross is not None:
                raise ConfigError(f"{path}: give exactly one of column, cross")
            if f.column is not None and not _COLUMN.fullmatch(f.column):
                raise ConfigError(f"{path}.column: {f.column!r} cannot be a serving input name (the exported "
                                  f"signature takes raw columns by name): use letters, digits, '_', '.', '-', '/' "
                                  f"only (rename the column in the log)")
            if f.column is not None and f.column == cfg.label.column:
                raise ConfigError(f"{path}.column: {f.column!r} is the label column (label.column): a feature of it "
                                  f"shows the model the answer, which serving does not know")
            names[f.name] = path
    if not cfg.features.sparse and not cfg.features.dense:
        raise ConfigError("features: declare at least one sparse or dense feature")

    sparse = cfg.sparse_by_name
    dims: set[int] = set()
    separators: dict[str, tuple[str, str]] = {}  # column -> (its first multivalent feature's path, separator)
    for i, f in enumerate(cfg.features.sparse):
        path = f"features.sparse[{i}]"
        modes = [m for m in ("vocab", "hash_buckets", "share_embedding_with") if getattr(f, m) is not None]
        if len(modes) != 1:
            raise ConfigError(f"{path}: give exactly one of vocab, hash_buckets, share_embedding_with "
                              f"(got {', '.join(modes) or 'none'})")
        _positive(f.hash_buckets, f"{path}.hash_buckets")
        _positive(f.embedding_dim, f"{path}.embedding_dim")
        if f.vocab is not None:
            _positive(f.vocab.min_count, f"{path}.vocab.min_count")
            _positive(f.vocab.max_size, f"{path}.vocab.max_size")
            _positive(f.vocab.oov_buckets, f"{path}.vocab.oov_buckets")
            _positive(f.vocab.window_days, f"{path}.vocab.window_days")
            _positive(f.vocab.evict_unseen_days, f"{path}.vocab.evict_unseen_days")
        if f.separator is not None and not f.multivalent:
            raise ConfigError(f"{path}.separator: only multivalent features take a separator")
        if f.multivalent and f.column is not None:  # one request input per column: lists joined by one separator
            sep = list_separator(f)
            first, first_sep = separators.setdefault(f.column, (path, sep))
            if first_sep != sep:
                raise ConfigError(f"{path}.separator: {sep!r}, but {first} reads column {f.column!r} with "
                                  f"{first_sep!r}; the features of one column split it alike")
        if f.share_embedding_with is not None:
            owner = sparse.get(f.share_embedding_with)
            if owner is None:
                raise ConfigError(f"{path}.share_embedding_with: no sparse feature named {f.share_embedding_with!r}")
            if owner.share_embedding_with is not None:
                raise ConfigError(f"{path}.share_embedding_with: {owner.name!r} itself shares another table; "
                                  f"point at the owning feature")
            if f.embedding_dim is not None and f.embedding_dim != embedding_dim(cfg, owner):
                raise ConfigError(f"{path}.embedding_dim: a shared table has the owner's dimension "
                                  f"({embedding_dim(cfg, owner)})")
        if f.cross is not None:
            _check_cross(cfg, f, path)
        dims.add(embedding_dim(cfg, f))
    for i, f in enumerate(cfg.features.dense):
        _positive(f.num_buckets, f"features.dense[{i}].num_buckets")

    if not 0 < (change := cfg.preprocess.max_presence_change) <= 1:
        raise ConfigError(f"preprocess.max_presence_change: must be in (0, 1], got {change}")
    _positive(cfg.preprocess.max_mean_shift, "preprocess.max_mean_shift")
    _check_feature_limits(cfg)
    if not 0 <= (dead := cfg.preprocess.max_dead_letter_fraction) <= 1:
        raise ConfigError(f"preprocess.max_dead_letter_fraction: must be in [0, 1], got {dead}")
    if not 0 <= (repeated := cfg.preprocess.max_repeated_row_fraction) <= 1:
        raise ConfigError(f"preprocess.max_repeated_row_fraction: must be in [0, 1], got {repeated}")
    if not 0 <= (least := cfg.preprocess.min_rows_vs_previous) <= 1:
        raise ConfigError(f"preprocess.min_rows_vs_previous: must be in [0, 1], got {least}")
    if not (most := cfg.preprocess.max_rows_vs_previous) >= 1:
        raise ConfigError(f"preprocess.max_rows_vs_previous: must be >= 1, got {most}")
    if not 0 < cfg.split.eval_fraction < 1:
        raise ConfigError(f"split.eval_fraction: must be between 0 and 1 (exclusive), got {cfg.split.eval_fraction}")
    if not 0 <= cfg.split.validation_fraction < 1:
        raise ConfigError(f"split.validation_fraction: must be in [0, 1), got {cfg.split.validation_fraction}")
    if cfg.split.by == "user":
        if cfg.split.user is None:
            raise ConfigError("split.user: a user split needs the column naming the user")
        if cfg.split_order is None:
            raise ConfigError("split.order: a user split needs the column ordering each user's rows (or set "
                              "input.timestamp)")
        for key in ("user", "order"):
            if getattr(cfg.split, key) is not None and not _COLUMN.fullmatch(getattr(cfg.split, key)):
                raise ConfigError(f"split.{key}: {getattr(cfg.split, key)!r} is not a usable column name")
    elif cfg.split.user is not None or cfg.split.order is not None:
        raise ConfigError("split.user: user and order are for a user split (split.by: user)")
    t = cfg.train
    _positive(t.batch_size, "train.batch_size")
    _positive(t.learning_rate, "train.learning_rate")
    _positive(t.steps, "train.steps")
    _positive(t.checkpoint_every, "train.checkpoint_every")
    _positive(t.embedding_l2, "train.embedding_l2", allow_zero=True)
    _positive(t.gradient_groups, "train.gradient_groups", allow_zero=True)
    _positive(t.horovod_cycle_time_ms, "train.horovod_cycle_time_ms", allow_zero=True)
    _positive(t.early_stopping.patience, "train.early_stopping.patience", allow_zero=True)
    k = t.tuning
    _positive(k.grad_accum_steps, "train.tuning.grad_accum_steps")
    _positive(k.steps_per_execution, "train.tuning.steps_per_execution", allow_zero=True)
    if t.batch_size % k.grad_accum_steps:
        raise ConfigError(f"train.tuning.grad_accum_steps: {k.grad_accum_steps} must divide train.batch_size "
                          f"({t.batch_size})")
    for key in ("data_ram_budget_mb", "prefetch_batches", "intra_op_threads", "inter_op_threads"):
        _positive(getattr(k, key), f"train.tuning.{key}", allow_zero=True)

    for j, p in enumerate(cfg.tune.params):
        path = f"tune.params[{j}]"
        if (p.choices is None) == (p.low is None or p.high is None):
            raise ConfigError(f"{path}: give either low and high, or choices")
        if p.choices is not None and not p.choices:
            raise ConfigError(f"{path}.choices: give at least one value")
        if p.low is not None and p.high is not None and (p.low > p.high or (p.log and p.low <= 0)):
            raise ConfigError(f"{path}: need low <= high{' and low > 0 (log scale)' if p.log else ''}, "
                              f"got [{p.low}, {p.high}]")
    _positive(cfg.tune.trials, "tune.trials")
    for j, sl in enumerate(cfg.evaluate.slices):
        path = f"evaluate.slices[{j}]"
        f = sparse.get(sl.feature)
        if f is None or f.multivalent:
            raise ConfigError(f"{path}.feature: {sl.feature!r} must be a single-valued sparse feature")
        if sl.by == "activity" and cfg.table_owner(f).vocab is None:
            raise ConfigError(f"{path}.by: activity needs train counts: {sl.feature!r} must have a vocab")
        _positive(sl.top, f"{path}.top")

    m = cfg.model
    allowed = MODEL_TYPES[m.task]
    if m.type not in allowed:
        raise ConfigError(f"model.type: {m.type!r} is not a {m.task} model (use {' | '.join(allowed)})")
    check_model_keys(m, model_keys)  # the keys of other types (a ranking model's towers, logistic's dropout)
    for key in ("deep_layers", "bottom_layers", "tower_layers"):
        for j, width in enumerate(getattr(m, key)):
            _positive(width, f"model.{key}[{j}]")
    _positive(m.cross_layers, "model.cross_layers", allow_zero=True)
    _positive(m.low_rank, "model.low_rank")
    if not 0 <= m.dropout < 1:
        raise ConfigError(f"model.dropout: must be in [0, 1), got {m.dropout}")
    metric = t.early_stopping.metric
    task_metrics = {"ranking": ("auc", "logloss"),
                    "retrieval": ("recall_at_10", "ndcg_at_10", "seen_excluded_recall_at_10",
                                  "seen_excluded_ndcg_at_10")}[m.task]
    if metric != "auto" and metric not in task_metrics:
        raise ConfigError(f"train.early_stopping.metric: {metric!r} is not a {m.task} metric "
                          f"(use auto | {' | '.join(task_metrics)})")
    if m.type == "dlrm" and len(dims) > 1:
        raise ConfigError(f"model.type: dlrm needs one embedding_dim for all sparse features, got {sorted(dims)}")
    if m.task == "retrieval":
        for key in ("query_features", "candidate_features"):
            listed = getattr(m, key)
            if not listed:
                raise ConfigError(f"model.{key}: retrieval needs at least one feature")
            for j, name in enumerate(listed):
                if name not in names:
                    raise ConfigError(f"model.{key}[{j}]: no feature named {name!r}")
        for j, name in enumerate(m.candidate_features):
            f = sparse.get(name)
            if f is None:
                raise ConfigError(f"model.candidate_features[{j}]: {name!r} must be a sparse feature")
            if j == 0 and f.multivalent:
                raise ConfigError(f"model.candidate_features[0]: {name!r} must be single-valued: the first "
                                  f"candidate feature is the candidate's ID (list item attributes such as genres "
                                  f"after it)")
        if m.query_key is not None and (sparse.get(m.query_key) is None or sparse[m.query_key].multivalent):
            raise ConfigError(f"model.query_key: {m.query_key!r} must be a single-valued sparse feature "
                              f"(the user's ID)")
        overlap = sorted(set(m.query_features) & set(m.candidate_features))
        if overlap:
            raise ConfigError(f"model.candidate_features: {overlap} also listed in model.query_features")
        if not m.tower_layers:
            raise ConfigError("model.tower_layers: give at least the output width")
        _positive(m.temperature, "model.temperature")
        _positive(m.uniform_negatives, "model.uniform_negatives", allow_zero=True)
        if m.uniform_negatives and len(m.candidate_features) > 1:
            raise ConfigError(f"model.uniform_negatives: drawn IDs have no attributes: use it with a single candidate "
                              f"feature (got {m.candidate_features})")
        first = sparse.get(m.candidate_features[0])
        if m.logq_correction and (first is None or cfg.table_owner(first).vocab is None):
            raise ConfigError(f"model.logq_correction: needs candidate frequencies: the first candidate feature "
                              f"({m.candidate_features[0]!r}) must have a vocab (the counts come from it)")
    return cfg


def _field_default(name: str) -> object:
    f = next(f for f in dataclasses.fields(ModelSpec) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def check_model_keys(model: ModelSpec, given: Optional[Iterable[str]] = None) -> None:
    """Refuse a model key the model's type does not read (model_keys), which training would ignore.

    Args:
        model: the built ModelSpec (its task and type already checked to agree).
        given: the keys the config's model mapping holds, as written; None when they are not known (a Config
            built in code): then the keys holding a value other than their default are the ones set.

    Raises:
        ConfigError: the first such key (in `given`'s order, else field order), naming the type, its task and
            the keys that type reads.
    """
    unread = unread_model_keys(model)
    if given is None:
        set_keys = [k for k in unread if getattr(model, k) != _field_default(k)]
    else:
        set_keys = [k for k in given if k in unread]
    if set_keys:
        key, reads = set_keys[0], keys_read_by(model)
        what = f"reads {', '.join(reads)}" if reads else "reads no model key"
        raise ConfigError(f"model.{key}: model.type {model.type} ({model.task}) does not read it, so it would change "
                          f"nothing; {model.type} {what} besides task and type: remove model.{key} (or choose a "
                          f"model.type that reads it)")


def _check_cross(cfg: Config, f: SparseFeature, path: str) -> None:
    if f.hash_buckets is None:
        raise ConfigError(f"{path}.cross: a cross is hashed: give hash_buckets (not vocab or share_embedding_with)")
    if f.multivalent:
        raise ConfigError(f"{path}.multivalent: a cross is single-valued")
    if len(f.cross) < 2 or len(set(f.cross)) != len(f.cross):
        raise ConfigError(f"{path}.cross: name two or more different sparse features, got {f.cross}")
    for j, source in enumerate(f.cross):
        s = cfg.sparse_by_name.get(source)
        if s is None or s.column is None or s.multivalent:
            raise ConfigError(f"{path}.cross[{j}]: {source!r} must be a single-valued sparse feature read from a "
                              f"column (not a dense, multivalent or crossed feature)")
