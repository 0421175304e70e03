"""The feature spec, loaded from YAML and validated once at the edge: load_config / parse_config give a
typed Config (recpipe.features.schema) or a ConfigError that names the offending key as a dotted path
(``features.sparse[2].vocab.min_count``), so a user can fix a config without reading code."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from recpipe.common.errors import ConfigError
from recpipe.common.typed_yaml import build_typed, check_typed, read_yaml
from recpipe.features.config_checks import validate
from recpipe.features.schema import (DEFAULT_EMBEDDING_DIM, Config, DenseFeature, EarlyStoppingSpec, EvaluateSpec,
                                     FeatureLimits, FeaturesSpec, InputSpec, LabelSpec, ModelSpec, PreprocessSpec,
                                     SliceSpec, SparseFeature, SplitSpec, TrainSpec, TuneParam, TuneSpec, TuningSpec,
                                     VocabSpec, embedding_dim, unread_model_keys)

__all__ = [
    "ConfigError", "VocabSpec", "SparseFeature", "DenseFeature", "FeaturesSpec", "InputSpec", "SplitSpec",
    "LabelSpec", "ModelSpec", "TuningSpec", "EarlyStoppingSpec", "TrainSpec", "TuneParam", "TuneSpec", "SliceSpec",
    "EvaluateSpec", "FeatureLimits", "PreprocessSpec", "Config", "DEFAULT_EMBEDDING_DIM", "embedding_dim",
    "load_config", "parse_config", "check_config", "config_to_dict", "dump_config",
]


def check_config(cfg: Config) -> Config:
    """Validate an already-built Config (e.g. one changed with dataclasses.replace) as parse_config would.

    Args:
        cfg: the Config.

    Returns:
        `cfg` itself.

    Raises:
        ConfigError: a field of the wrong type, or a check across fields failed; the message names the key.
    """
    return validate(check_typed(cfg))


# The model keys config_to_dict wrote in every model mapping before it left out those the type does not read:
# it wrote every field not null, and these fields (not null by default) are as old as the config. A mapping that
# holds them all is such a dump, a transform artifact's, model dir's or export's config.yaml, not a user's
# config (which would list both ranking and retrieval keys): it loads, the keys its type ignored reset to their
# defaults, which is what its model was trained with.
_EARLIER_DUMP_MODEL_KEYS = frozenset({"task", "type", "cross_layers", "deep_layers", "bottom_layers", "query_features",
                                      "candidate_features", "tower_layers"})


def parse_config(data: Any) -> Config:
    """Build and validate a Config from already-parsed YAML or JSON data.

    A model key the model's type does not read is refused when the model mapping holds it (see
    recpipe.features.config_checks.check_model_keys), but in a config dumped before config_to_dict left such
    keys out (one holding every key of every type), where they are reset to their defaults.

    Args:
        data: the parsed mapping.

    Returns:
        The typed, validated Config.

    Raises:
        ConfigError: the first problem, naming its key.
    """
    cfg = build_typed(Config, data)
    given = data.get("model", {})  # a mapping: build_typed checked it
    if _EARLIER_DUMP_MODEL_KEYS <= set(given):
        defaults = ModelSpec(task=cfg.model.task, type=cfg.model.type)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, **{key: getattr(defaults, key) for key in unread_model_keys(cfg.model)}))
        return validate(cfg)
    return validate(cfg, model_keys=list(given))


def load_config(path: str | Path) -> Config:
    """Load and validate a feature spec YAML.

    Args:
        path: the YAML file.

    Returns:
        The typed, validated Config.

    Raises:
        ConfigError: the file is unreadable, not YAML, or invalid; the message names the file and the key.
    """
    data = read_yaml(path)
    try:
        return parse_config(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def config_to_dict(cfg: Config) -> dict:
    """The Config as plain data, keys of unset (None) values and the model keys its type does not read left
    out; parse_config reads it back.

    Args:
        cfg: the Config.

    Returns:
        Nested dicts and lists.
    """
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    out = strip(dataclasses.asdict(cfg))
    unread = set(unread_model_keys(cfg.model))
    out["model"] = {k: v for k, v in out["model"].items() if k not in unread}
    return out


def dump_config(cfg: Config) -> str:
    """The Config as YAML text, in field order; load_config reads it back.

    Args:
        cfg: the Config.

    Returns:
        The YAML text.
    """
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
