"""SavedModel export with the feature transform in the graph, and a TF-Serving-compatible server."""
from features import tf_env  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
