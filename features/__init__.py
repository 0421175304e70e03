"""Feature spec (YAML config), the artifacts stages exchange, and the one feature transform."""
from features import tf_env  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features.config import Config, ConfigError, load_config, parse_config
from features.errors import RecpipeError

__all__ = ["Config", "ConfigError", "RecpipeError", "load_config", "parse_config"]
