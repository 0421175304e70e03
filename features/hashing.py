"""FarmHash fingerprint buckets without TensorFlow: `Fingerprint64(token) % buckets`, the value
`tf.strings.to_hash_bucket_fast` (and so StaticVocabularyTable's OOV buckets) gives, from the same
farmhash library (pyfarmhash). The batch path of the transform hashes with this; the graph keeps
TF's op. tests/test_features.py checks they agree token for token (unicode, empty, long tokens).
"""
from __future__ import annotations

import farmhash
import numpy as np
import pyarrow as pa

__all__ = ["hash_buckets"]


def hash_buckets(tokens: pa.Array, buckets: int) -> np.ndarray:
    """int64 bucket of each string token (no nulls: canonical columns have none)."""
    if buckets <= 0:
        raise ValueError(f"hash buckets must be positive, got {buckets}")
    fingerprints = np.fromiter(map(farmhash.fingerprint64, tokens.to_pylist()), dtype=np.uint64, count=len(tokens))
    return (fingerprints % np.uint64(buckets)).astype(np.int64)
