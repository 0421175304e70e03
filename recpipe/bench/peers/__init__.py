"""Standalone scripts the quality bench runs in the peer environment (recpipe.bench.peer_env), one per peer.

Each imports only numpy, scipy and its peer library (LightGBM, implicit), never recpipe or TensorFlow, and is
run as `python -I SCRIPT REQUEST.json`: the request names the .npz files the bench exported and the files the
script writes back (predictions, factors, and the chosen hyperparameters as JSON). The bench computes every
metric itself, with the functions its own models are scored by.
"""
