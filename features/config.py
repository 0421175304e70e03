"""The pipeline config: typed dataclasses, loaded from YAML and validated once at the edge.

Every error names the offending key as a dotted path (``features.sparse[2].vocab.min_count``)
so a user can fix a config without reading code.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from features.errors import RecpipeError

__all__ = [
    "ConfigError", "VocabSpec", "SparseFeature", "DenseFeature", "FeaturesSpec", "InputSpec",
    "SplitSpec", "LabelSpec", "ModelSpec", "EarlyStoppingSpec", "TrainSpec", "TuneParam", "TuneSpec",
    "SliceSpec", "EvaluateSpec", "PreprocessSpec", "Config", "load_config", "parse_config", "check_config",
    "config_to_dict", "dump_config", "build_typed", "check_typed", "literal_choices", "read_yaml",
]


class ConfigError(RecpipeError, ValueError):
    """A config is invalid; the message names the key."""


@dataclass(frozen=True)
class VocabSpec:
    min_count: int = 1              # admission: a new value needs this many train rows ...
    max_size: Optional[int] = None  # slots (IDs) in all; kept values win, new ones by count (pipeline.lifecycle)
    oov_buckets: int = 1
    window_days: int = 1            # ... over the last window_days days (runs with --previous-transform)
    evict_unseen_days: Optional[int] = None  # a value not seen for this many days frees its slot


@dataclass(frozen=True)
class SparseFeature:
    name: str
    column: Optional[str] = None
    # instead of a column: a hashed cross of these single-valued sparse features' values (as TF's
    # crossed_column), computed in the one transform; needs hash_buckets
    cross: Optional[list[str]] = None
    vocab: Optional[VocabSpec] = None
    hash_buckets: Optional[int] = None
    embedding_dim: Optional[int] = None
    multivalent: bool = False
    separator: Optional[str] = None
    combiner: Literal["mean", "sum"] = "mean"
    share_embedding_with: Optional[str] = None


@dataclass(frozen=True)
class DenseFeature:
    name: str
    column: str
    transform: Literal["zscore", "log_zscore", "bucketize"] = "zscore"
    fill: float = 0.0
    num_buckets: int = 10
    # a finite value beyond float32's range (e.g. 1e39): dead-letter its row, or clip it to the range
    out_of_range: Literal["dead_letter", "clip"] = "dead_letter"


@dataclass(frozen=True)
class FeaturesSpec:
    sparse: list[SparseFeature] = field(default_factory=list)
    dense: list[DenseFeature] = field(default_factory=list)


@dataclass(frozen=True)
class InputSpec:
    timestamp: Optional[str] = None


@dataclass(frozen=True)
class SplitSpec:
    """by: time (the default): rows by time (timestamp, else row order): the last eval_fraction are
    eval, touched once at the end; of the rows before them, the last validation_fraction are validation
    (early stopping, model selection, `recpipe tune`); the rest are train.
    by: user (leave-last-out, how retrieval is usually judged): each user's rows with the last value of
    `order` (a column, else input.timestamp), e.g. their last basket, are eval, if the user has an earlier
    one; with validation_fraction > 0, the value before it is validation (users with 3+ values); the rest
    is train (eval_fraction is not used). Vocabularies and statistics come from train only."""
    eval_fraction: float = 0.1
    validation_fraction: float = 0.0
    by: Literal["time", "user"] = "time"
    user: Optional[str] = None    # by: user: the column naming the user
    order: Optional[str] = None   # by: user: the column ordering a user's rows (default: input.timestamp)
    on_empty: Literal["fail", "warn"] = "fail"  # an empty train, validation or eval split fails the preprocess run


@dataclass(frozen=True)
class LabelSpec:
    column: str = "label"


@dataclass(frozen=True)
class ModelSpec:
    task: Literal["ranking", "retrieval"] = "ranking"
    type: Literal["dcn_v2", "dlrm", "logistic", "two_tower"] = "dcn_v2"  # logistic: the baseline
    cross_layers: int = 2
    low_rank: Optional[int] = None
    deep_layers: list[int] = field(default_factory=lambda: [256, 128])
    bottom_layers: list[int] = field(default_factory=lambda: [64])
    query_features: list[str] = field(default_factory=list)       # retrieval: the query tower's inputs
    # retrieval: sparse features; the first is the candidate's ID (single-valued), the others its attributes
    # (multivalent ones too, e.g. genres), taken from the candidate's first row when candidates are enumerated
    candidate_features: list[str] = field(default_factory=list)
    tower_layers: list[int] = field(default_factory=lambda: [64, 32])
    # retrieval: the single-valued sparse feature naming the user, whose earlier clicks evaluation uses
    # ("already seen", co-occurrence, users with history); it need not be a tower input. Default: the
    # first query feature, when it is a single-valued sparse feature
    query_key: Optional[str] = None
    # ranking: add a wide (linear) logit to DCN-v2/DLRM's (one weight per ID + a linear term on the dense
    # features, as in Wide & Deep): the memorisation small logs reward
    wide: bool = False
    dropout: float = 0.0                                          # after each deep layer, while training
    # retrieval: the in-batch softmax's temperature (logits / T), and logQ correction: subtract log of each
    # in-batch candidate's sampling probability (its train frequency, from the vocabulary counts the Beam
    # job keeps), so popular items are not over-penalised as negatives (Yi et al., RecSys 2019)
    temperature: Optional[float] = None
    logq_correction: bool = False
    # retrieval: mixed negatives: this many candidate IDs drawn uniformly each step, beside the in-batch ones
    # (needs a single candidate feature: drawn IDs have no attribute rows)
    uniform_negatives: int = 0
    # retrieval: do not score a row's candidate as a negative of another row with the same candidate ID
    # (TFRS's remove_accidental_hits)
    remove_accidental_hits: bool = False


@dataclass(frozen=True)
class TuningSpec:
    """Memory/throughput knobs of the trainer. Each one is benchmarked by `recpipe bench train`
    (bench/results/train.md); the defaults are the measured best on this kind of 2-core CPU box."""
    dedup_ids: bool = True             # unique-then-gather: one lookup (and one gradient row) per distinct ID
    grad_accum_steps: int = 1          # k micro-batches per batch, one optimizer step (less activation memory)
    steps_per_execution: int = 1       # Keras: steps run per dispatched function (PS: per remote call)
    jit_dense: bool = False            # XLA-compile the dense part (cross/deep/top MLP) of ranking models
    data_ram_budget_mb: int = 0        # tf.data autotune RAM budget (0: tf.data's default, half of RAM)
    prefetch_batches: int = 0          # prefetch buffer in batches (0: AUTOTUNE)
    intra_op_threads: int = 0          # TensorFlow thread pools (0: TensorFlow's default = cores)
    inter_op_threads: int = 0
    # LD_PRELOADed by `recpipe train`; auto: tcmalloc when installed, else system
    allocator: Literal["auto", "system", "tcmalloc", "jemalloc"] = "auto"


@dataclass(frozen=True)
class EarlyStoppingSpec:
    """Model selection on the validation split (split.validation_fraction > 0): each checkpoint is
    scored on it, the best one is kept and is what evaluate, export and warm start use; with
    patience > 0, training stops after that many checkpoints without improvement."""
    metric: Literal["auto", "auc", "logloss", "recall_at_10", "ndcg_at_10"] = "auto"  # auto: auc / recall_at_10
    patience: int = 0


@dataclass(frozen=True)
class TrainSpec:
    batch_size: int = 1024
    learning_rate: float = 0.05
    optimizer: Literal["adagrad", "adam", "sgd"] = "adagrad"
    steps: int = 2000
    checkpoint_every: int = 500
    seed: int = 42
    # Horovod embedding gradients: per table (auto: densified and allreduced where that puts no more
    # bytes on a rank's link than allgathering its rows + IDs, trainers.advisor.allreduces_table, else
    # allgathered), or every table allgathered / densified.
    # Measured np=2, 1 thread each, 3 round-robin runs on the synthetic default: auto 24.0k, dense 23.4k,
    # allgather 21.9k ex/s; allgather vs dense with a 1M-row table 10.8k vs 6.7k.
    sparse_gradients: Literal["auto", "allgather", "dense"] = "auto"
    # Horovod: a step's gradients exchanged in this many grouped collectives (dense ones in one grouped
    # allreduce, embedding rows in one grouped allgather per group), or one collective per tensor (0,
    # Horovod's default). Measured np=2, 1 thread each, 3 round-robin runs: 21.3k vs 20.2k ex/s.
    gradient_groups: int = 1
    # Horovod: how often each rank's background thread wakes to agree with the others on what is ready
    # (HOROVOD_CYCLE_TIME; Horovod's default is 1 ms, and the environment variable, if set, wins). Every
    # wake-up is a round of messages between the ranks, whether or not anything is ready, and on a box
    # whose cores the ranks' compute threads already fill those rounds cost more than the latency a longer
    # cycle adds. Measured np=2, 1 thread each, 3 round-robin runs of 300 steps: +22 % over 1 ms on an AVX2
    # host, the same as 1 ms on an AVX512-BF16 one (README, "Horovod"; bench/results/train.md).
    horovod_cycle_time_ms: float = 5.0
    # L2 on the embedding rows a batch looks up (mean over the batch of each feature's squared norm): the
    # regularisation sparse tables need, as rows of rare IDs are updated rarely (not weight decay on the table)
    embedding_l2: float = 0.0
    early_stopping: EarlyStoppingSpec = field(default_factory=EarlyStoppingSpec)
    tuning: TuningSpec = field(default_factory=TuningSpec)


@dataclass(frozen=True)
class TuneParam:
    """One dimension of `recpipe tune`'s search: `key` is a dotted config path (e.g. model.dropout,
    train.embedding_l2); a float or int range [low, high] (log: sampled on a log scale), or choices."""
    key: str
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    integer: bool = False
    choices: Optional[list[Any]] = None


@dataclass(frozen=True)
class TuneSpec:
    trials: int = 20
    seed: int = 0
    params: list[TuneParam] = field(default_factory=list)


@dataclass(frozen=True)
class SliceSpec:
    """A slice of `recpipe evaluate`'s metrics: by each value of a single-valued sparse feature (its `top`
    most frequent in the split, the rest "other"), or by the value's train activity (how often it occurs in
    train, in power-of-two buckets; needs a vocab), e.g. per user-activity bucket."""
    feature: str
    by: Literal["value", "activity"] = "value"
    top: int = 10


@dataclass(frozen=True)
class EvaluateSpec:
    slices: list[SliceSpec] = field(default_factory=list)


@dataclass(frozen=True)
class FeatureLimits:
    """preprocess.features[]: one feature's own anomaly limits in place of the run's (as TFX's schema gives
    each feature its own skew and drift thresholds): a feature known to be filled unevenly, or to move, or
    to be that predictive, is not named for it while the others still are."""
    feature: str
    max_presence_change: Optional[float] = None  # None: preprocess.max_presence_change
    max_mean_shift: Optional[float] = None       # dense features only; None: preprocess.max_mean_shift
    leak_check: bool = True                      # false: not named for ordering the rows by label alone


@dataclass(frozen=True)
class PreprocessSpec:
    # anomalies (pipeline.anomalies): a feature the train split gives nothing to learn from (no value in any
    # train row, or a dense one of one value), that the eval split lacks, or whose splits disagree beyond the
    # limits below (with the previous day's run too); a ranking split of one label; a file whose timestamps
    # are in another unit; more rows dead-lettered than the limit below: a warning naming each (warn), or the
    # preprocess run fails (fail)
    on_anomaly: Literal["warn", "fail"] = "warn"
    # the share of rows holding a value may move this much (absolute, 0-1) from the train split to the
    # validation or eval split, or from the previous day's train split to this one's
    max_presence_change: float = 0.25
    # a dense feature's validation/eval rows (or a day's train rows against the previous day's) may average
    # this many train standard deviations away, in the units the model normalises it with
    max_mean_shift: float = 1.0
    # more than this share of the rows read dead-lettered says something upstream broke
    max_dead_letter_fraction: float = 0.05
    # more than this share of the rows read repeating an earlier row in every column read (pipeline.repeats)
    # says rows were written twice upstream or a join fanned out; a file whose every row repeats earlier
    # rows is named whatever its share. 1 turns the check off (the job then hashes no rows)
    max_repeated_row_fraction: float = 0.01
    # a day's run (--previous-transform) reads, per dt= partition day, at least this share of the rows the
    # previous run read per day (fewer: a partition only partly written, rows dropped upstream) and at most
    # this many times them (more: rows in two files, a re-run's output beside the first run's); TFX's
    # num_examples drift comparator. 0 and a large max turn them off.
    min_rows_vs_previous: float = 0.5
    max_rows_vs_previous: float = 1.75
    # per-feature limits in place of the two above, and the label-leak check turned off for a feature
    features: list[FeatureLimits] = field(default_factory=list)

    def limit(self, feature: str, key: str) -> tuple[float, str]:
        """(max_presence_change or max_mean_shift for `feature`, the config key it comes from)."""
        for i, own in enumerate(self.features):
            if own.feature == feature and getattr(own, key) is not None:
                return getattr(own, key), f"preprocess.features[{i}].{key}"
        return getattr(self, key), f"preprocess.{key}"

    def leak_checked(self, feature: str) -> bool:
        return all(own.leak_check for own in self.features if own.feature == feature)


@dataclass(frozen=True)
class Config:
    name: str
    features: FeaturesSpec
    input: InputSpec = field(default_factory=InputSpec)
    split: SplitSpec = field(default_factory=SplitSpec)
    label: LabelSpec = field(default_factory=LabelSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    tune: TuneSpec = field(default_factory=TuneSpec)  # read by `recpipe tune` only
    evaluate: EvaluateSpec = field(default_factory=EvaluateSpec)  # read by `recpipe evaluate` only
    preprocess: PreprocessSpec = field(default_factory=PreprocessSpec)  # read by `recpipe preprocess` only

    @property
    def sparse_by_name(self) -> dict[str, SparseFeature]:
        return {f.name: f for f in self.features.sparse}

    @property
    def column_sparse(self) -> list[SparseFeature]:
        """The sparse features read from a log column (every one but the crosses)."""
        return [f for f in self.features.sparse if f.column is not None]

    @property
    def crosses(self) -> list[SparseFeature]:
        return [f for f in self.features.sparse if f.cross is not None]

    def table_owner(self, feature: SparseFeature) -> SparseFeature:
        """The feature whose ID space and embedding table `feature` uses."""
        if feature.share_embedding_with:
            return self.sparse_by_name[feature.share_embedding_with]
        return feature

    @property
    def split_order(self) -> Optional[str]:
        """The column a user split orders each user's rows by (None for a time split)."""
        return (self.split.order or self.input.timestamp) if self.split.by == "user" else None

    def raw_columns(self) -> list[str]:
        """Every log column the config reads, label, timestamp and split columns included, in a stable order."""
        cols = [self.label.column]
        for c in (self.input.timestamp, self.split.user, self.split_order):
            if c and c not in cols:
                cols.append(c)
        for f in [*self.column_sparse, *self.features.dense]:
            if f.column not in cols:
                cols.append(f.column)
        return cols


DEFAULT_EMBEDDING_DIM = 16
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# A raw column a feature reads becomes a SavedModel signature input of the same name, so it must be a
# valid TensorFlow op name (a column "user id" would fail at export, after all the training).
_COLUMN = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-/]*")
# PyYAML follows YAML 1.1, where 1e-9 (no dot) is a string; accept such numbers for number keys.
_FLOAT_STRING = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


# ---------------------------------------------------------------- generic typed loading
def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def _coerce(tp: Any, value: Any, path: str) -> Any:
    if tp is Any:  # free-form (tune choices): checked where it is used
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {_describe(tp)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected {_describe(tp)}, got {type(value).__name__}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # an already-built instance (check_typed): check its fields
            _check_fields(value, path)
            return value
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_STRING.fullmatch(value.strip()):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: expected a non-empty string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r}")


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown key (known keys: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        key_path = f"{path}.{name}" if path else name
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], key_path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key_path}: required key is missing")
    return cls(**kwargs)


# ---------------------------------------------------------------- semantic checks
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


def _validate(cfg: Config) -> Config:
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
    _positive(k.steps_per_execution, "train.tuning.steps_per_execution")
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
    allowed = {"ranking": ("dcn_v2", "dlrm", "logistic"), "retrieval": ("two_tower",)}[m.task]
    if m.type not in allowed:
        raise ConfigError(f"model.type: {m.type!r} is not a {m.task} model (use {' | '.join(allowed)})")
    for key in ("deep_layers", "bottom_layers", "tower_layers"):
        for j, width in enumerate(getattr(m, key)):
            _positive(width, f"model.{key}[{j}]")
    _positive(m.cross_layers, "model.cross_layers", allow_zero=True)
    _positive(m.low_rank, "model.low_rank")
    if not 0 <= m.dropout < 1:
        raise ConfigError(f"model.dropout: must be in [0, 1), got {m.dropout}")
    if m.wide and m.type not in ("dcn_v2", "dlrm"):
        raise ConfigError(f"model.wide: only dcn_v2 and dlrm take a wide logit ({m.type} has none)")
    metric = t.early_stopping.metric
    task_metrics = {"ranking": ("auc", "logloss"), "retrieval": ("recall_at_10", "ndcg_at_10")}[m.task]
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
    elif m.query_features or m.candidate_features or m.query_key:
        raise ConfigError("model.query_features: only retrieval models have towers and a query key")
    elif m.temperature is not None or m.logq_correction or m.uniform_negatives or m.remove_accidental_hits:
        raise ConfigError("model.temperature: temperature, logq_correction, uniform_negatives and "
                          "remove_accidental_hits are for retrieval models")
    return cfg


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


def embedding_dim(cfg: Config, feature: SparseFeature) -> int:
    owner = cfg.table_owner(feature)
    return owner.embedding_dim or DEFAULT_EMBEDDING_DIM


# ---------------------------------------------------------------- entry points
def build_typed(cls: type, data: Any) -> Any:
    """Any config dataclass from parsed YAML, with the same key-naming errors as the main config."""
    return _build(cls, data, "")


def _check_fields(obj: Any, path: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        _coerce(hints[f.name], getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)


def check_typed(obj: Any) -> Any:
    """Check an already-built config dataclass field by field against its annotations (Literal
    choices, int/float/str/bool, nested dataclasses), with the same key-naming errors; returns it."""
    _check_fields(obj, "")
    return obj


def literal_choices(cls: type, name: str) -> tuple:
    """The allowed values of a Literal-typed field, e.g. for argparse `choices`."""
    tp = typing.get_type_hints(cls)[name]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # Optional[Literal[...]]
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()


def check_config(cfg: Config) -> Config:
    """Validate an already-built (e.g. dataclasses.replace'd) Config as parse_config would."""
    return _validate(check_typed(cfg))


def parse_config(data: Any) -> Config:
    """Build and validate a Config from already-parsed YAML/JSON data."""
    return _validate(_build(Config, data, ""))


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """A YAML file (duplicate keys refused); every problem is a ConfigError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None


def load_config(path: str | Path) -> Config:
    """Load a YAML config; every problem is a ConfigError naming the file and the key."""
    data = read_yaml(path)
    try:
        return parse_config(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def config_to_dict(cfg: Config) -> dict:
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(dataclasses.asdict(cfg))


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
