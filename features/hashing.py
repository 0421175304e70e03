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
    """int64 bucket of each string token (no nulls: canonical columns have none). A token that is not
    UTF-8 (a dictionary's value of a dead-lettered row) is hashed as its bytes, as a UTF-8 one is."""
    if buckets <= 0:
        raise ValueError(f"hash buckets must be positive, got {buckets}")
    try:
        values = tokens.to_pylist()
    except UnicodeDecodeError:
        values = tokens.cast(pa.binary()).to_pylist()
    fingerprints = np.fromiter(map(farmhash.fingerprint64, values), dtype=np.uint64, count=len(tokens))
    return (fingerprints % np.uint64(buckets)).astype(np.int64)
