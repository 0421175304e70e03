"""The `recpipe` command line, demo, daily steps and benchmarks: thin layers over the packages."""
from features import tf_env  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
