"""Feature spec (YAML config), the artifacts stages exchange, and the one feature transform."""
from recpipe.common.errors import RecpipeError
from recpipe.features.config import Config, ConfigError, load_config, parse_config

__all__ = ["Config", "ConfigError", "RecpipeError", "load_config", "parse_config"]
