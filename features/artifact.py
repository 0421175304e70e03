"""The transform artifact: everything the analysis pass learnt, as files in one folder.

It is the interface between the Beam job (which writes it), the trainer (embedding sizes) and
the serving export (lookup tables inside the graph). Layout of ``DIR``:

    config.yaml        the config the job ran with
    transform.json     raw schema, ID-space sizes, dense statistics, split, row counts, versions
    vocab/NAME.json    {"values": [...], "counts": [...], "last_seen": [...], "pending": [...]} in ID
                       order, one per vocabulary owner; a null value is a free slot (pipeline.lifecycle)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from features.config import Config, SparseFeature, dump_config, parse_config
from features import fsio
from features.errors import RecpipeError

__all__ = ["RAW_KINDS", "TransformArtifact", "ArtifactError", "FORMAT_VERSION"]

FORMAT_VERSION = 1
# How a raw log column is represented; the serving signature and the Beam reader both key on it.
RAW_KINDS = ("string", "int", "uint64", "float", "list<string>", "list<int>", "list<uint64>")


class ArtifactError(RecpipeError, ValueError):
    """A transform artifact is missing, incomplete or from another format version."""


@dataclass
class TransformArtifact:
    config: Config
    raw_schema: dict[str, str]
    vocabularies: dict[str, list[Optional[str]]] = field(default_factory=dict)  # ID -> value; None: free slot
    vocab_counts: dict[str, list[int]] = field(default_factory=dict)
    dense_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    split: dict[str, Any] = field(default_factory=dict)
    row_counts: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)  # e.g. the previous day's transform it extends
    day: Optional[str] = None  # YYYY-MM-DD of the run (--day, or the input's dt= partitions)
    # the vocabularies' lifecycle state (pipeline.lifecycle)
    vocab_last_seen: dict[str, list[Optional[int]]] = field(default_factory=dict)  # ID -> day (since 1970-01-01)
    vocab_pending: dict[str, list[list]] = field(default_factory=dict)  # [value, day, rows] not admitted yet

    # ------------------------------------------------------------ ID spaces
    def id_space_size(self, feature: SparseFeature) -> int:
        """Number of distinct IDs the feature (or the table it shares) can produce."""
        owner = self.config.table_owner(feature)
        if owner.hash_buckets is not None:
            return owner.hash_buckets
        assert owner.vocab is not None
        return len(self.vocabularies[owner.name]) + owner.vocab.oov_buckets

    def table_sizes(self) -> dict[str, int]:
        """Embedding table name (the owning feature) -> number of rows."""
        return {f.name: self.id_space_size(f) for f in self.config.features.sparse
                if f.share_embedding_with is None}

    # ------------------------------------------------------------ files
    def write(self, directory: str) -> None:
        fsio.makedirs(fsio.join(directory, "vocab"))
        fsio.write_text(fsio.join(directory, "config.yaml"), dump_config(self.config))
        for name, values in self.vocabularies.items():
            body = {"values": values, "counts": self.vocab_counts.get(name, []),
                    "last_seen": self.vocab_last_seen.get(name, []), "pending": self.vocab_pending.get(name, [])}
            fsio.write_text(fsio.join(directory, "vocab", f"{name}.json"), json.dumps(body))
        self.write_meta(directory)  # last: its presence marks a complete artifact

    def write_meta(self, directory: str) -> None:
        """(Re)write transform.json alone, e.g. once the job knows its row counts."""
        meta = {
            "format_version": FORMAT_VERSION,
            "raw_schema": self.raw_schema,
            "id_space_sizes": {f.name: self.id_space_size(f) for f in self.config.features.sparse},
            "dense_stats": self.dense_stats,
            "split": self.split,
            "row_counts": self.row_counts,
            "versions": self.versions,
            "lineage": self.lineage,
            "day": self.day,
        }
        fsio.write_text(fsio.join(directory, "transform.json"), json.dumps(meta, indent=1, sort_keys=True))

    @staticmethod
    def read_meta(directory: str) -> dict[str, Any]:
        """transform.json of an artifact folder, its format version checked."""
        meta_path = fsio.join(directory, "transform.json")
        if not fsio.exists(meta_path):
            raise ArtifactError(f"{directory}: not a transform artifact (no transform.json)")
        meta = fsio.read_json(meta_path)
        if meta.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{meta_path}: format_version {meta.get('format_version')} "
                                f"is not {FORMAT_VERSION}")
        return meta

    @classmethod
    def read(cls, directory: str) -> "TransformArtifact":
        meta = cls.read_meta(directory)
        config = parse_config(yaml.safe_load(fsio.read_text(fsio.join(directory, "config.yaml"))))
        vocabularies, counts, last_seen, pending = {}, {}, {}, {}
        for f in config.features.sparse:
            if f.vocab is not None and f.share_embedding_with is None:
                path = fsio.join(directory, "vocab", f"{f.name}.json")
                if not fsio.exists(path):
                    raise ArtifactError(f"{path}: vocabulary file missing")
                body = fsio.read_json(path)
                vocabularies[f.name] = body["values"]
                counts[f.name] = body.get("counts", [])
                last_seen[f.name] = body.get("last_seen", [])
                pending[f.name] = body.get("pending", [])
        return cls(config=config, raw_schema=meta["raw_schema"], vocabularies=vocabularies,
                   vocab_counts=counts, vocab_last_seen=last_seen, vocab_pending=pending,
                   dense_stats=meta["dense_stats"], split=meta["split"],
                   row_counts=meta["row_counts"], versions=meta.get("versions", {}),
                   lineage=meta.get("lineage", {}), day=meta.get("day"))
