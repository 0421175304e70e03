"""Export: the trained model and the feature transform as one SavedModel version (pruned, quantized)."""
