"""Feature spec (YAML config), transform artifact and the one feature transform.

Importing the TensorFlow parts (features.transform, features.records) sets TF_USE_LEGACY_KERAS=1
first, because TensorFlow Recommenders needs tf-keras (Keras 2), never Keras 3.
"""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

from features.config import Config, ConfigError, load_config, parse_config  # noqa: E402

__all__ = ["Config", "ConfigError", "load_config", "parse_config"]
