"""Beam preprocessing: Parquet click logs -> sparse ID features (see pipeline.preprocess)."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
