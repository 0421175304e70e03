"""The folder `recpipe preprocess` writes: the interface between the Beam job, the trainers and the export.

    ROOT/transform/             the TransformArtifact (its transform.json carries the row counts)
    ROOT/train/part-*.tfrecord  training shards (recpipe.features.records batches)
    ROOT/validation/part-*.tfrecord  validation shards (empty unless split.validation_fraction > 0):
                                early stopping and model selection
    ROOT/eval/part-*.tfrecord   evaluation shards: touched once, at the end
    ROOT/dead_letter/*.parquet  rows that cannot be used: source_file, row, reason, field, row_json
    ROOT/eval_sample.parquet    up to 1,000 raw eval rows, and eval_sample.tfrecord the same rows
                                transformed like the shards: the export's skew check compares them

The job publishes ROOT atomically (local paths) and writes the row counts last, so a folder whose
artifact has row counts is complete. The row counts also list each split's shards and their sizes
(`shard_bytes`), so a copy of ROOT can be checked whole without reading a shard (copy_differences).
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from recpipe.common import fsio
from recpipe.features.artifact import ArtifactError, TransformArtifact

__all__ = ["PreprocessedData", "SPLITS", "shard_differences"]

SPLITS = ("train", "validation", "eval")  # in time order


def shard_differences(expected: dict | None, found: dict | None, shown: int = 3) -> list[str]:
    """How shards found ({split: {file name: bytes}}) differ from those expected: files lacking or there
    besides, and files of other sizes (a copy cut short, or still going on). None on either side: []."""
    if expected is None or found is None:
        return []
    out = []
    for split in sorted(set(expected) | set(found)):
        a, b = expected.get(split, {}), found.get(split, {})
        for what, names in (("lacks", sorted(set(a) - set(b))), ("also has", sorted(set(b) - set(a)))):
            if names:
                more = f" and {len(names) - shown} more" if len(names) > shown else ""
                out.append(f"its {split}/ {what} {', '.join(names[:shown])}{more}")
        sized = sorted(n for n in set(a) & set(b) if a[n] != b[n])
        out += [f"{split}/{n} is {b[n]:,} bytes against {a[n]:,}" for n in sized[:shown]]
        if len(sized) > shown:
            out.append(f"{len(sized) - shown} more {split} shards of other sizes")
    return out


@dataclass(frozen=True)
class PreprocessedData:
    """A `recpipe preprocess` output folder (the layout above); nothing is read until a method asks.

    Attributes:
        root: the folder: a local path (made absolute, as other artifacts record it) or a URI (kept as given).
    """
    root: str

    def __post_init__(self):
        if "://" not in self.root:  # local paths are kept absolute: the folder is recorded in other artifacts
            object.__setattr__(self, "root", os.path.abspath(self.root))

    @classmethod
    def at(cls, path: str) -> "PreprocessedData":
        """The output folder, also when given its transform/ folder (as --previous-transform may be).

        Args:
            path: the output folder, or its transform/ folder (one holding transform.json and no transform/).

        Returns:
            The PreprocessedData of the output folder.
        """
        if fsio.exists(fsio.join(path, "transform.json")) and not fsio.exists(fsio.join(path, "transform")):
            return cls(posixpath.dirname(path.rstrip("/")) if "://" in path else
                       os.path.dirname(os.path.abspath(path)))
        return cls(path)

    # ------------------------------------------------------------ layout
    transform_dir = fsio.SubPath("transform")
    dead_letter_dir = fsio.SubPath("dead_letter")
    dead_letter_prefix = fsio.SubPath("dead_letter", "part")
    eval_sample_parquet = fsio.SubPath("eval_sample.parquet")
    eval_sample_records = fsio.SubPath("eval_sample.tfrecord")
    row_counts_path = fsio.SubPath("_row_counts.json")  # the job's own count, moved into the artifact
    repeats_path = fsio.SubPath("_repeats.json")  # rows equal to earlier rows (recpipe.pipeline.repeats), read and removed
    row_hashes_dir = fsio.SubPath("_row_hashes")  # the repeated-rows check's staged hashes, removed with it

    def split_dir(self, split: str) -> str:
        """The folder of one split's shards.

        Args:
            split: one of SPLITS ("train", "validation", "eval").

        Returns:
            ROOT/<split>.

        Raises:
            ValueError: `split` is not one of SPLITS.
        """
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: use {', '.join(SPLITS)}")
        return fsio.join(self.root, split)

    def shard_prefix(self, split: str) -> str:
        """The path prefix the Beam job writes one split's shards under (ROOT/<split>/part).

        Args:
            split: one of SPLITS.

        Returns:
            ROOT/<split>/part.

        Raises:
            ValueError: `split` is not one of SPLITS.
        """
        return fsio.join(self.split_dir(split), "part")

    # ------------------------------------------------------------ contents
    def shard_files(self, split: str) -> list[str]:
        """One split's shard files.

        Args:
            split: one of SPLITS.

        Returns:
            The paths of the split's *.tfrecord files, sorted ([] when its folder does not exist).

        Raises:
            ValueError: `split` is not one of SPLITS.
        """
        return fsio.list_files(self.split_dir(split), ".tfrecord")

    def shard_sizes(self) -> dict[str, dict[str, int]]:
        """Each split's shard sizes, from one listing per split (no shard is opened).

        Returns:
            {split: {shard file name: bytes}} for every split of SPLITS ({} for a split without a folder).
        """
        return {split: fsio.file_sizes(self.split_dir(split), ".tfrecord") for split in SPLITS}

    def copy_differences(self) -> list[str]:
        """How the shards here differ from those the job wrote (the row counts' `shard_bytes`): a copy of the
        folder cut short or still going on, or an older run's shards left beside this run's.

        Returns:
            One line per difference (see shard_differences); [] when there is none, when the artifact cannot
            be read, or when its row counts record no `shard_bytes` (a folder written before the job recorded them).
        """
        try:
            written = (TransformArtifact.read_meta(self.transform_dir).get("row_counts") or {}).get("shard_bytes")
        except ArtifactError:
            return []
        return shard_differences(written, self.shard_sizes()) if written is not None else []

    def dead_letter_files(self) -> list[str]:
        """The dead-letter Parquet files (rows that cannot be used).

        Returns:
            The paths of ROOT/dead_letter/*.parquet, sorted ([] when there is no such folder).
        """
        return fsio.list_files(self.dead_letter_dir, ".parquet")

    def has_eval_sample(self) -> bool:
        """Whether the folder holds the eval sample the export's skew check compares.

        Returns:
            True when both eval_sample.parquet and eval_sample.tfrecord exist.
        """
        return fsio.exists(self.eval_sample_parquet) and fsio.exists(self.eval_sample_records)

    def eval_sample_table(self):
        """The raw eval rows of eval_sample.parquet (a pyarrow Table), or None when the eval split is empty."""
        if not fsio.exists(self.eval_sample_parquet):
            return None
        import pyarrow.parquet as pq
        fs, path = fsio.resolve(self.eval_sample_parquet)
        return pq.read_table(path, filesystem=fs)

    def transform(self) -> TransformArtifact:
        """The TransformArtifact the job wrote to ROOT/transform/.

        Returns:
            The artifact, read whole (metadata, config and vocabularies).

        Raises:
            ArtifactError: ROOT/transform/ holds no readable artifact (the folder is not a `recpipe preprocess`
                output, or is incomplete).
        """
        try:
            return TransformArtifact.read(self.transform_dir)
        except ArtifactError as e:
            raise ArtifactError(f"{self.root}: not a `recpipe preprocess` output ({e})") from None

    def is_complete(self) -> bool:
        """Whether the job finished and published this folder (the row counts are written last).

        Returns:
            True when the artifact's metadata holds row counts; False when it has none or cannot be read.
        """
        try:
            return bool(TransformArtifact.read_meta(self.transform_dir).get("row_counts"))
        except ArtifactError:
            return False
