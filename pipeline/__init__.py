"""Beam preprocessing: Parquet click logs -> sparse ID features (see pipeline.preprocess)."""
from features import tf_env  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
