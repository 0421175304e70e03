"""The batch path of the one transform, for the Beam job: canonical Arrow columns -> the model
inputs FeatureTransform (recpipe.features.transform) makes, with Arrow, numpy and farmhash instead of
TensorFlow, so the job never loads TensorFlow.

- vocabulary IDs: `pc.index_in` against the vocabulary (a free slot matches nothing); a dictionary-encoded
  column's (recpipe.features.canonical.encoded_columns) once per dictionary entry, then gathered;
- OOV tokens and hashed features: slots + Fingerprint64(token) % buckets (recpipe.features.hashing), the
  value TF's FarmHash op gives;
- dense: recpipe.features.canonical.dense_prenorm (fill, log1p) and the z-score / bucket index in float32.

IDs equal FeatureTransform's exactly; dense values agree to float32 rounding (numpy's log1p and
Eigen's may differ in the last bit). tests/test_features.py checks both, and every export's skew
check scores the raw eval sample through the SavedModel's graph against the records this path wrote.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import dense_prenorm, is_id_dictionary, list_parts
from recpipe.features.dictionaries import DictionaryMemo
from recpipe.features.hashing import hash_buckets
from recpipe.features.record_codec import Ragged

__all__ = ["BatchTransform", "MIN_STD", "zscore_std"]

MIN_STD = 1e-6  # a dense feature with a smaller train std is only centred (FeatureTransform too)


def zscore_std(stats: dict) -> float:
    return float(stats["std"]) if float(stats["std"]) > MIN_STD else 1.0


class BatchTransform:
    def __init__(self, artifact: TransformArtifact):
        self._cfg = artifact.config
        self._stats = artifact.dense_stats
        self._vocab = {f.name: pa.array(artifact.vocabularies[f.name], pa.string())
                       for f in self._cfg.features.sparse if f.vocab is not None and f.share_embedding_with is None}
        self._memo: DictionaryMemo[np.ndarray] = DictionaryMemo()

    def _ids(self, owner_name: str, tokens: pa.Array) -> np.ndarray:
        owner = self._cfg.sparse_by_name[owner_name]
        if owner.hash_buckets is not None:
            return hash_buckets(tokens, owner.hash_buckets)
        vocab = self._vocab[owner_name]
        ids = pc.index_in(tokens, value_set=vocab, skip_nulls=True)  # free slots (nulls) match nothing
        ids = pc.fill_null(ids, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        oov = ids < 0
        if oov.any():  # as StaticVocabularyTable: vocabulary size + FarmHash64(token) % oov_buckets
            ids[oov] = len(vocab) + hash_buckets(tokens.filter(pa.array(oov)), owner.vocab.oov_buckets)
        return ids

    def _dictionary_ids(self, feature: str, owner_name: str, tokens: pa.DictionaryArray) -> np.ndarray:
        """_ids of a dictionary-encoded column: each dictionary entry looked up once (once per row group,
        through the memo), gathered per row. The dictionary may also hold values of rows dead-lettered
        (not UTF-8: hashed as their bytes) or in another split."""
        ids = self._memo.get(feature, tokens.dictionary, lambda values: self._ids(owner_name, values))
        return np.take(ids, np.asarray(tokens.indices))  # canonical: no null index

    def _dense(self, name: str, transform: str, fill: float, values: pa.Array) -> np.ndarray:
        x = dense_prenorm(values.to_numpy(zero_copy_only=False).astype(np.float32), transform, fill)
        stats = self._stats[name]
        if transform == "bucketize":
            boundaries = np.asarray([float(b) for b in stats["boundaries"]], np.float32)  # TF's attr is float32
            idx = np.searchsorted(boundaries, x, side="right")
            return idx.astype(np.float32) / np.float32(max(len(boundaries), 1))
        return (x - np.float32(stats["mean"])) / np.float32(zscore_std(stats))

    def __call__(self, columns: dict[str, pa.Array]) -> dict[str, np.ndarray | Ragged]:
        out: dict = {}
        for f in self._cfg.features.sparse:
            if f.name not in columns:
                continue
            owner = self._cfg.table_owner(f).name
            arr = columns[f.name]
            if pa.types.is_list(arr.type):
                values, splits = list_parts(arr)
                out[f.name] = Ragged(self._ids(owner, values), np.diff(splits))
            elif is_id_dictionary(arr):
                out[f.name] = self._dictionary_ids(f.name, owner, arr)
            else:
                out[f.name] = self._ids(owner, arr)
        for d in self._cfg.features.dense:
            if d.name in columns:
                out[d.name] = self._dense(d.name, d.transform, d.fill, columns[d.name])
        return out
