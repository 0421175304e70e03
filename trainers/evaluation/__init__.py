"""Evaluation of a trained model: metrics over the eval split, slices, candidates, plots, validation."""
