"""SavedModel export with the feature transform in the graph, and a TF-Serving-compatible server."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
