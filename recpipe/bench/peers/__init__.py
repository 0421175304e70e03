"""Standalone scripts the benches run in environments of their own (recpipe.bench.isolated_env), one per peer:
LightGBM and implicit's ALS for `recpipe bench quality` (recpipe.bench.peer_env), TorchRec's DLRM for
`recpipe bench embedding` (recpipe.bench.torchrec_peer).

Each imports only numpy, scipy and its peer library (LightGBM, implicit; torch, TorchRec and FBGEMM), never
recpipe or TensorFlow, and is run as `python -I SCRIPT REQUEST.json`: the request names the .npz files the
bench exported and the files the script writes back (predictions, factors, timings, and the chosen
hyperparameters as JSON). The bench computes every metric itself, with the functions its own models are
scored by.
"""
