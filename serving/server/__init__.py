"""The model server: loads exported versions and serves TF Serving's REST and gRPC APIs. It imports
nothing of training."""
