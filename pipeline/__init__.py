"""Beam preprocessing: Parquet click logs -> sparse ID features (see recpipe.pipeline.preprocess)."""
