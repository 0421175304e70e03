"""The feature spec's schema: the typed dataclasses a project YAML becomes (see recpipe.features.config to
load one). Each field's annotation is its type; recpipe.features.config_checks holds the checks across fields."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional

from recpipe.common.errors import ConfigError

__all__ = [
    "ConfigError", "VocabSpec", "SparseFeature", "DenseFeature", "FeaturesSpec", "InputSpec", "SplitSpec",
    "LabelSpec", "ModelSpec", "TuningSpec", "EarlyStoppingSpec", "TrainSpec", "TuneParam", "TuneSpec", "SliceSpec",
    "EvaluateSpec", "FeatureLimits", "PreprocessSpec", "Config", "DEFAULT_EMBEDDING_DIM", "embedding_dim",
    "DEFAULT_SEPARATOR", "list_separator", "logq_correction", "MODEL_TYPES", "MODEL_KEYS", "CANDIDATES", "model_keys",
    "candidate_types", "unread_model_keys", "query_key_feature", "history_feature",
]

DEFAULT_EMBEDDING_DIM = 16
DEFAULT_SEPARATOR = "|"  # a multivalent feature's separator when it names none


@dataclass(frozen=True)
class VocabSpec:
    min_count: int = 1              # admission: a new value needs this many train rows ...
    max_size: Optional[int] = None  # slots (IDs) in all; kept values win, new ones by count (recpipe.pipeline.lifecycle)
    oov_buckets: int = 1            # IDs shared by the values not in the vocabulary (hashed among them)
    window_days: int = 1            # ... over the last window_days days (runs with --previous-transform)
    evict_unseen_days: Optional[int] = None  # a value not seen for this many days frees its slot


@dataclass(frozen=True)
class SparseFeature:
    name: str                       # the feature's name: letters, digits and '_', starting with a letter
    column: Optional[str] = None    # the log column it reads (or give cross)
    # instead of a column: a hashed cross of these single-valued sparse features' values (as TF's
    # crossed_column), computed in the one transform; needs hash_buckets
    cross: Optional[list[str]] = None
    vocab: Optional[VocabSpec] = None       # IDs from a vocabulary of the train split's values (or hash_buckets)
    hash_buckets: Optional[int] = None      # IDs by hashing the value into this many buckets (or vocab)
    embedding_dim: Optional[int] = None     # the embedding's width (default: 16)
    multivalent: bool = False               # the column holds lists (or separated strings) of values
    # multivalent: what separates the values of a string row, literally (no pattern, no trimming), and what
    # serving joins a list's items with (null: a vertical bar); a list item holding it is dead-lettered
    separator: Optional[str] = None
    combiner: Literal["mean", "sum"] = "mean"  # how a multivalent feature's embeddings are pooled
    share_embedding_with: Optional[str] = None  # use that sparse feature's IDs and table (e.g. a history of items)


@dataclass(frozen=True)
class DenseFeature:
    name: str                       # the feature's name: letters, digits and '_', starting with a letter
    column: str                     # the log column it reads (numbers, or strings that parse as numbers)
    # zscore: (x - mean) / sd over the train split; log_zscore: the same on log1p(x); bucketize: the bucket
    # of x among num_buckets train quantiles
    transform: Literal["zscore", "log_zscore", "bucketize"] = "zscore"
    fill: float = 0.0               # the value a null or empty cell takes
    num_buckets: int = 10           # transform bucketize: how many quantile buckets
    # a finite value beyond float32's range (e.g. 1e39): dead-letter its row, or clip it to the range
    out_of_range: Literal["dead_letter", "clip"] = "dead_letter"


@dataclass(frozen=True)
class FeaturesSpec:
    sparse: list[SparseFeature] = field(default_factory=list)  # ID features, each with an embedding table
    dense: list[DenseFeature] = field(default_factory=list)    # numeric features, normalised


@dataclass(frozen=True)
class InputSpec:
    timestamp: Optional[str] = None  # the time column (a timestamp, date, or epoch seconds); none: row order


@dataclass(frozen=True)
class SplitSpec:
    """by: time (the default): rows by time (timestamp, else row order): the last eval_fraction are
    eval, touched once at the end; of the rows before them, the last validation_fraction are validation
    (early stopping, model selection, `recpipe tune`); the rest are train.
    by: user (leave-last-out, how retrieval is usually judged): each user's rows with the last value of
    `order` (a column, else input.timestamp), e.g. their last basket, are eval, if the user has an earlier
    one; with validation_fraction > 0, the value before it is validation (users with 3+ values); the rest
    is train (eval_fraction is not used). Vocabularies and statistics come from train only."""
    eval_fraction: float = 0.1        # by: time: the last share of rows, the eval split
    validation_fraction: float = 0.0  # the share before it, the validation split (0: none)
    by: Literal["time", "user"] = "time"  # time: the last rows by time; user: each user's last value of order
    user: Optional[str] = None    # by: user: the column naming the user
    order: Optional[str] = None   # by: user: the column ordering a user's rows (default: input.timestamp)
    on_empty: Literal["fail", "warn"] = "fail"  # an empty train, validation or eval split fails the preprocess run


@dataclass(frozen=True)
class LabelSpec:
    column: str = "label"  # the 0/1 column (integers, booleans, floats or strings); other rows are dead-lettered


@dataclass(frozen=True)
class ModelSpec:
    """Each model.type reads only some of these keys (each key's meaning starts with the types that read it;
    task and type are always read): a config that sets a key its type does not read is refused, naming the
    keys that type reads, rather than trained on as if the key were not there."""
    task: Literal["ranking", "retrieval"] = "ranking"  # ranking: score a row; retrieval: top k items for a query
    # auto: ranking trains dcn_v2 and logistic, retrieval two_tower and item_to_item (where it applies), and keeps
    # the best on the validation split (one training each). logistic: the baseline. item_to_item: EASE, the
    # closed-form item-to-item model over the query's history feature, else each user's earlier clicks
    # (recpipe.trainers.item_to_item)
    type: Literal["auto", "dcn_v2", "dlrm", "logistic", "two_tower", "item_to_item"] = "auto"
    cross_layers: int = 2                 # dcn_v2: cross layers
    low_rank: Optional[int] = None        # dcn_v2: factor each cross layer's matrix to this rank (none: full)
    deep_layers: list[int] = field(default_factory=lambda: [256, 128])  # dcn_v2, dlrm: the deep (top) MLP's widths
    bottom_layers: list[int] = field(default_factory=lambda: [64])      # dlrm: the dense features' MLP
    # retrieval: the query tower's inputs (item_to_item: the first names the user when query_key is unset)
    query_features: list[str] = field(default_factory=list)
    # retrieval: sparse features; the first is the candidate's ID (single-valued), the others its attributes
    # (multivalent ones too, e.g. genres), taken from the candidate's first row when candidates are enumerated
    # (two_tower reads them; item_to_item scores the IDs alone)
    candidate_features: list[str] = field(default_factory=list)
    tower_layers: list[int] = field(default_factory=lambda: [64, 32])  # two_tower: each tower's MLP widths
    # retrieval: the single-valued sparse feature naming the user, whose earlier clicks evaluation uses ("already
    # seen", co-occurrence, users with history) and item_to_item scores from; it need not be a tower input.
    # Default: the first query feature, when it is a single-valued sparse feature
    query_key: Optional[str] = None
    # dcn_v2, dlrm: add a wide (linear) logit to the deep one (one weight per ID + a linear term on the dense
    # features, as in Wide & Deep): the memorisation small logs reward
    wide: bool = False
    dropout: float = 0.0                  # dcn_v2, dlrm: after each deep layer, while training
    # two_tower: the in-batch softmax's temperature (logits / T), and logQ correction: subtract log of each
    # in-batch candidate's sampling probability (its train frequency, from the vocabulary counts the Beam
    # job keeps), so popular items are not over-penalised as negatives (Yi et al., RecSys 2019)
    temperature: Optional[float] = None
    # two_tower: subtract log of each in-batch candidate's frequency (unset: on when the first candidate feature has
    # a vocabulary, whose train counts give the frequencies; then a query the model knows nothing of, a new user,
    # ranks candidates by popularity, not below it)
    logq_correction: Optional[bool] = None
    # two_tower: mixed negatives: this many candidate IDs drawn uniformly each step, beside the in-batch ones
    # (needs a single candidate feature: drawn IDs have no attribute rows)
    uniform_negatives: int = 0
    # two_tower: do not score a row's candidate as a negative of another row with the same candidate ID
    # (TFRS's remove_accidental_hits)
    remove_accidental_hits: bool = False


# The model types of each task.
MODEL_TYPES: dict[str, tuple[str, ...]] = {"ranking": ("auto", "dcn_v2", "dlrm", "logistic"),
                                           "retrieval": ("auto", "two_tower", "item_to_item")}

# The types `type: auto` trains and selects among on the validation split, the first the one trained alone when there
# is no validation split: for ranking a deep model and the logistic one, which small or sparse logs can favour; for
# retrieval the two towers and item_to_item, trained where it applies (recpipe.trainers.item_to_item.unfit_reason).
CANDIDATES: dict[str, tuple[str, ...]] = {"ranking": ("dcn_v2", "logistic"),
                                          "retrieval": ("two_tower", "item_to_item")}

# The ModelSpec keys each model.type reads besides task and type: the one table the config checks refuse the
# other keys by (recpipe.features.config_checks.check_model_keys). Read off recpipe.trainers.models.build_model
# (and layers.py): dcn_v2 = CrossStack(cross_layers, low_rank) + the deep MLP; dlrm = DotInteractionBlock(
# bottom_layers) + the deep MLP; both: dropout after each deep layer, wide. logistic: no deep layers (so no
# dropout), its one-wide embeddings are already the wide logit (a second is refused). two_tower: RetrievalModel,
# and query_key, which only evaluation reads (recpipe.trainers.evaluation.candidates.query_key_feature). item_to_item:
# ItemToItemModel, its user the query key (query_key, else the first query feature), its candidate the first
# candidate feature.
# tests/test_model_keys.py builds every type with each key changed and checks the table against the result.
MODEL_KEYS: dict[str, tuple[str, ...]] = {
    "dcn_v2": ("cross_layers", "low_rank", "deep_layers", "wide", "dropout"),
    "dlrm": ("deep_layers", "bottom_layers", "wide", "dropout"),
    "logistic": (),
    "two_tower": ("query_features", "candidate_features", "tower_layers", "query_key", "temperature",
                  "logq_correction", "uniform_negatives", "remove_accidental_hits"),
    "item_to_item": ("query_features", "candidate_features", "query_key"),
}


@dataclass(frozen=True)
class TuningSpec:
    """Memory/throughput knobs of the trainer. Each one is benchmarked by `recpipe bench train`
    (bench/results/train.md); the defaults are the measured best on this kind of 2-core CPU box."""
    dedup_ids: bool = True             # unique-then-gather: one lookup (and one gradient row) per distinct ID
    grad_accum_steps: int = 1          # k micro-batches per batch, one optimizer step (less activation memory)
    steps_per_execution: int = 0       # Keras: steps run per dispatched function (0: 100, and 1 under PS)
    jit_dense: bool = False            # XLA-compile the dense part (cross/deep/top MLP) of ranking models
    data_ram_budget_mb: int = 0        # tf.data autotune RAM budget (0: tf.data's default, half of RAM)
    prefetch_batches: int = 0          # prefetch buffer in batches (0: AUTOTUNE)
    intra_op_threads: int = 0          # TensorFlow thread pools (0: TensorFlow's default = cores)
    inter_op_threads: int = 0          # (0: TensorFlow's default)
    # LD_PRELOADed by `recpipe train`; auto: tcmalloc when installed, else system
    allocator: Literal["auto", "system", "tcmalloc", "jemalloc"] = "auto"


@dataclass(frozen=True)
class EarlyStoppingSpec:
    """Model selection on the validation split (split.validation_fraction > 0): each checkpoint is
    scored on it, the best one is kept and is what evaluate, export and warm start use; with
    patience > 0, training stops after that many checkpoints without improvement."""
    # auto: auc / recall_at_10; seen_excluded_*: retrieval with only the candidates new to each query ranked
    metric: Literal["auto", "auc", "logloss", "recall_at_10", "ndcg_at_10", "seen_excluded_recall_at_10",
                    "seen_excluded_ndcg_at_10"] = "auto"
    patience: int = 0  # stop after this many checkpoints without improvement (0: never)


@dataclass(frozen=True)
class TrainSpec:
    batch_size: int = 1024            # rows per step (over all workers or ranks)
    learning_rate: float = 0.05       # the optimizer's step size
    optimizer: Literal["adagrad", "adam", "sgd"] = "adagrad"  # one optimizer for the tables and the dense layers
    steps: int = 2000                 # total steps (`recpipe train --steps` overrides it)
    checkpoint_every: int = 500       # steps between checkpoints (and validation scores)
    seed: int = 42                    # initial weights and data order
    # Horovod embedding gradients: per table (auto: densified and allreduced where that puts no more
    # bytes on a rank's link than allgathering its rows + IDs, recpipe.trainers.advisor.allreduces_table, else
    # allgathered), or every table allgathered / densified.
    sparse_gradients: Literal["auto", "allgather", "dense"] = "auto"
    # Horovod: a step's gradients exchanged in this many grouped collectives (dense ones in one grouped
    # allreduce, embedding rows in one grouped allgather per group), or one collective per tensor (0,
    # Horovod's default).
    gradient_groups: int = 1
    # Horovod: how often each rank's background thread wakes to agree with the others on what is ready
    # (HOROVOD_CYCLE_TIME; Horovod's default is 1 ms, and the environment variable, if set, wins). Every
    # wake-up is a round of messages between the ranks, whether or not anything is ready, and on a box
    # whose cores the ranks' compute threads already fill those rounds cost more than the latency a longer
    # cycle adds (bench/results/train.md).
    horovod_cycle_time_ms: float = 5.0
    # L2 on the embedding rows a batch looks up (mean over the batch of each feature's squared norm): the
    # regularisation sparse tables need, as rows of rare IDs are updated rarely (not weight decay on the table)
    embedding_l2: float = 0.0
    early_stopping: EarlyStoppingSpec = field(default_factory=EarlyStoppingSpec)  # model selection on validation
    tuning: TuningSpec = field(default_factory=TuningSpec)  # memory and throughput knobs


@dataclass(frozen=True)
class TuneParam:
    """One dimension of `recpipe tune`'s search: `key` is a dotted config path (e.g. model.dropout,
    train.embedding_l2); a float or int range [low, high] (log: sampled on a log scale), or choices."""
    key: str                            # the dotted config key searched, e.g. train.learning_rate
    low: Optional[float] = None         # the range's low end
    high: Optional[float] = None        # the range's high end
    log: bool = False                   # sample the range on a log scale
    integer: bool = False               # integers only
    choices: Optional[list[Any]] = None  # instead of a range: these values


@dataclass(frozen=True)
class TuneSpec:
    trials: int = 20                    # trainings to run
    seed: int = 0                       # the search's seed
    params: list[TuneParam] = field(default_factory=list)  # the dimensions searched


@dataclass(frozen=True)
class SliceSpec:
    """A slice of `recpipe evaluate`'s metrics: by each value of a single-valued sparse feature (its `top`
    most frequent in the split, the rest "other"), or by the value's train activity (how often it occurs in
    train, in power-of-two buckets; needs a vocab), e.g. per user-activity bucket."""
    feature: str                        # a single-valued sparse feature
    by: Literal["value", "activity"] = "value"  # its values, or its values' train activity buckets
    top: int = 10                       # by: value: the most frequent values shown (the rest: other)


@dataclass(frozen=True)
class EvaluateSpec:
    slices: list[SliceSpec] = field(default_factory=list)  # metrics per slice, beside the overall ones


@dataclass(frozen=True)
class FeatureLimits:
    """preprocess.features[]: one feature's own anomaly limits in place of the run's (as TFX's schema gives
    each feature its own skew and drift thresholds): a feature known to be filled unevenly, or to move, or
    to be that predictive, is not named for it while the others still are."""
    feature: str                                 # the feature these limits are for
    max_presence_change: Optional[float] = None  # None: preprocess.max_presence_change
    max_mean_shift: Optional[float] = None       # dense features only; None: preprocess.max_mean_shift
    leak_check: bool = True                      # false: not named for ordering the rows by label alone


@dataclass(frozen=True)
class PreprocessSpec:
    # anomalies (recpipe.pipeline.anomalies): a feature the train split gives nothing to learn from (no value in any
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
    # more than this share of the rows read repeating an earlier row in every column read (recpipe.pipeline.repeats)
    # says rows were written twice upstream or a join fanned out; a file whose every row repeats earlier
    # rows is named whatever its share. 1 turns the check off (the job then hashes no rows)
    max_repeated_row_fraction: float = 0.01
    # a day's run (--previous-transform) reads, per dt= partition day, at least this share of the rows the
    # previous run read per day (fewer: a partition only partly written, rows dropped upstream) and at most
    # this many times them (more: rows in two files, a re-run's output beside the first run's); TFX's
    # num_examples drift comparator. 0 and a large max turn them off.
    min_rows_vs_previous: float = 0.5
    max_rows_vs_previous: float = 1.75  # see min_rows_vs_previous
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
    """A project's feature spec: one YAML file, typed and validated (build one with
    recpipe.features.config.load_config or parse_config, which check the fields against each other).

    Attributes:
        name: the project's name.
        features: the sparse (ID) and dense features the one transform computes.
        input: how to read the logs (the timestamp column, if any).
        split: how rows are split into train, validation and eval.
        label: the label column.
        model: the model's task, type and architecture.
        train: the trainer's settings (optimizer, steps, checkpoints, early stopping, tuning knobs).
        tune: the search space of `recpipe tune` (read by it only).
        evaluate: the slices of `recpipe evaluate`'s metrics (read by it only).
        preprocess: the anomaly limits of `recpipe preprocess` (read by it only).
    """
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
        """The feature whose ID space and embedding table `feature` uses.

        Args:
            feature: a sparse feature of this config.

        Returns:
            The feature named by `feature.share_embedding_with`, else `feature` itself.
        """
        if feature.share_embedding_with:
            return self.sparse_by_name[feature.share_embedding_with]
        return feature

    @property
    def split_order(self) -> Optional[str]:
        """The column a user split orders each user's rows by (None for a time split)."""
        return (self.split.order or self.input.timestamp) if self.split.by == "user" else None

    def raw_columns(self) -> list[str]:
        """Every log column the config reads, label, timestamp and split columns included, in a stable order.

        Returns:
            The column names, each once: the label column first, then the timestamp, split user and split
            order columns (those set), then the sparse features' and dense features' columns in config order.
        """
        cols = [self.label.column]
        for c in (self.input.timestamp, self.split.user, self.split_order):
            if c and c not in cols:
                cols.append(c)
        for f in [*self.column_sparse, *self.features.dense]:
            if f.column not in cols:
                cols.append(f.column)
        return cols


def unread_model_keys(model: ModelSpec) -> tuple[str, ...]:
    """The model keys the model's type does not read.

    Args:
        model: a ModelSpec.

    Returns:
        Its field names other than task, type and MODEL_KEYS[model.type], in field order.
    """
    reads = model_keys(model)
    return tuple(f.name for f in fields(ModelSpec) if f.name not in ("task", "type") and f.name not in reads)


def model_keys(model: ModelSpec) -> tuple[str, ...]:
    """The model keys the model's type reads besides task and type.

    Args:
        model: a ModelSpec.

    Returns:
        MODEL_KEYS[model.type]; for type auto, every key one of the task's CANDIDATES reads.
    """
    if model.type != "auto":
        return MODEL_KEYS[model.type]
    return tuple(dict.fromkeys(k for t in CANDIDATES[model.task] for k in MODEL_KEYS[t]))


def candidate_types(model: ModelSpec) -> tuple[str, ...]:
    """The model types a training run of this model trains.

    Args:
        model: a ModelSpec.

    Returns:
        (model.type,), or the task's CANDIDATES for type auto.
    """
    return CANDIDATES[model.task] if model.type == "auto" else (model.type,)


def logq_correction(cfg: Config) -> bool:
    """Whether a retrieval model trains with logQ correction (model.logq_correction, or its default).

    Args:
        cfg: the config.

    Returns:
        model.logq_correction when set, else whether the first candidate feature's table has a vocabulary
        (its train counts are the frequencies); False for a ranking model.
    """
    m = cfg.model
    if m.task != "retrieval":
        return False
    if m.logq_correction is not None:
        return m.logq_correction
    first = cfg.sparse_by_name.get(m.candidate_features[0]) if m.candidate_features else None
    return first is not None and cfg.table_owner(first).vocab is not None


def query_key_feature(cfg: Config) -> Optional[str]:
    """The feature naming a retrieval query's user: whose earlier clicks evaluation and item_to_item read.

    Args:
        cfg: a retrieval config.

    Returns:
        model.query_key, else the first query feature when it is a single-valued sparse feature, else None.
    """
    if cfg.model.query_key is not None:
        return cfg.model.query_key
    first = cfg.model.query_features[0]
    f = cfg.sparse_by_name.get(first)
    return first if f is not None and not f.multivalent else None


def history_feature(cfg: Config) -> Optional[str]:
    """The query feature that lists candidates the row's user had before it, if any.

    Args:
        cfg: a retrieval config.

    Returns:
        The first multivalent query feature in the first candidate feature's table (e.g. `hist` sharing
        item_id's), else None.
    """
    owner = cfg.table_owner(cfg.sparse_by_name[cfg.model.candidate_features[0]]).name
    for name in cfg.model.query_features:
        f = cfg.sparse_by_name.get(name)
        if f is not None and f.multivalent and cfg.table_owner(f).name == owner:
            return name
    return None


def embedding_dim(cfg: Config, feature: SparseFeature) -> int:
    owner = cfg.table_owner(feature)
    return owner.embedding_dim or DEFAULT_EMBEDDING_DIM


def list_separator(feature: SparseFeature) -> str:
    """The separator of a multivalent feature.

    Args:
        feature: a sparse feature.

    Returns:
        Its `separator`, else DEFAULT_SEPARATOR: what a string row of its column is split on, and what
        serving joins a list row with.
    """
    return DEFAULT_SEPARATOR if feature.separator is None else feature.separator
