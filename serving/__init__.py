"""SavedModel export with the feature transform in the graph, and a TF-Serving-compatible server."""
