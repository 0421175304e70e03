"""The transform artifact: everything the analysis pass learnt, as files in one folder.

It is the interface between the Beam job (which writes it), the trainer (embedding sizes) and
the serving export (lookup tables inside the graph). Layout of ``DIR``:

    config.yaml        the config the job ran with
    transform.json     raw schema, ID-space sizes, dense statistics, split, row counts, versions
    vocab/NAME.json    {"values": [...], "counts": [...], "last_seen": [...], "pending": [...]} in ID
                       order, one per vocabulary owner; a null value is a free slot (recpipe.pipeline.lifecycle)
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from recpipe.features.config import Config, SparseFeature, dump_config, parse_config
from recpipe.common import fsio
from recpipe.common.errors import RecpipeError
from recpipe.common.typed_yaml import parse_yaml

__all__ = ["RAW_KINDS", "TransformArtifact", "ArtifactError", "FORMAT_VERSION", "summary_differences"]

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
    # the vocabularies' lifecycle state (recpipe.pipeline.lifecycle)
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

    def mapping_differences(self, other: "TransformArtifact", ours: str, theirs: str, limit: int = 3) -> list[str]:
        """Where `other` turns raw rows into other model inputs than this artifact does (for the same
        config): per vocabulary, IDs that stand for another value or that only one of them has; per
        dense feature, the statistics its normalisation uses. Empty when both give every row the same
        IDs and values (row counts, value counts, lifecycle state and the split may differ, as between
        two runs of one job on the same logs). `ours`/`theirs` name the two ("the model's"), up to
        `limit` lines."""
        out: list[str] = []
        for name, mine in self.vocabularies.items():
            other_values = other.vocabularies.get(name)
            if other_values is not None and other_values != mine:
                out.append(_vocabulary_difference(name, mine, other_values, ours, theirs))
        for d in self.config.features.dense:
            a, b = self.dense_stats.get(d.name, {}), other.dense_stats.get(d.name, {})
            if not _same_stats(a, b):
                out.append(f"dense feature {d.name!r} is normalised with {_stats_text(a)} in {ours} transform and "
                           f"{_stats_text(b)} in {theirs}")
        return out[:limit] + ([f"and {len(out) - limit} more"] if len(out) > limit else [])

    def mapping_summary(self) -> dict[str, Any]:
        """What mapping_differences compares, small enough to send between processes: a sha256 of every
        vocabulary's values by ID, and every dense feature's statistics but its row count. Two
        summaries are compared with `summary_differences`, which allows the statistics the same float
        tolerance as mapping_differences (a hash of them would not)."""
        vocabularies = hashlib.sha256(json.dumps(self.vocabularies, sort_keys=True).encode()).hexdigest()
        return {"vocabularies": vocabularies,
                "dense": {name: _without_count(stats) for name, stats in self.dense_stats.items()}}

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
        config_path = fsio.join(directory, "config.yaml")
        config = parse_config(parse_yaml(fsio.read_text(config_path), config_path))
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


def _vocabulary_difference(name: str, a: list[Optional[str]], b: list[Optional[str]], ours: str, theirs: str) -> str:
    """One line on how vocabulary `b` differs from `a` (they differ)."""
    common = min(len(a), len(b))
    moved = [i for i in range(common) if a[i] != b[i]]
    what = lambda v: "a free slot" if v is None else "'' (a missing value)" if v == "" else repr(v)  # noqa: E731
    text = f"feature {name!r}: "
    if moved:
        i = moved[0]
        text += (f"{len(moved):,} of the {common:,} IDs both vocabularies hold stand for other values (ID {i}: "
                 f"{what(a[i])} in {ours}, {what(b[i])} in {theirs})")
        if len(a) != len(b):
            text += f"; {ours} holds {len(a):,} values, {theirs} {len(b):,}"
        return text
    longer, shorter, extra = (theirs, ours, len(b) - len(a)) if len(b) > len(a) else (ours, theirs, len(a) - len(b))
    return (f"{text}{longer} vocabulary holds {shorter} {common:,} values under the same IDs and {extra:,} more "
            f"(IDs {common:,} and up): from a later run that extended it (--previous-transform)?")


def summary_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where two TransformArtifact.mapping_summary()s differ: "the vocabularies" (some ID stands for
    another value), and each dense feature whose statistics differ beyond float noise."""
    out = [] if a["vocabularies"] == b["vocabularies"] else ["the vocabularies"]
    for name in sorted(set(a["dense"]) | set(b["dense"])):
        x, y = a["dense"].get(name, {}), b["dense"].get(name, {})
        if not _same_stats(x, y):
            out.append(f"the statistics of dense feature {name!r} ({_stats_text(x)} against {_stats_text(y)})")
    return out


def _without_count(stats: dict[str, Any]) -> dict[str, Any]:
    """A dense feature's statistics that its transform uses: all but the row count."""
    return {k: v for k, v in stats.items() if k != "count"}


_STAT_TOLERANCE = 1e-9  # relative: two runs of the job on the same rows may sum them in another order


def _same_stats(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The statistics a dense transform uses (mean, std, bucket boundaries; not the row count) agree."""
    def close(x, y) -> bool:
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return len(x) == len(y) and all(close(u, v) for u, v in zip(x, y))
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            return math.isclose(x, y, rel_tol=_STAT_TOLERANCE, abs_tol=1e-12)
        return x == y
    a, b = _without_count(a), _without_count(b)
    return all(close(a.get(k), b.get(k)) for k in set(a) | set(b))


def _stats_text(stats: dict[str, Any]) -> str:
    parts = []
    for key, value in sorted(_without_count(stats).items()):
        if isinstance(value, (list, tuple)):
            shown = ", ".join(f"{v:.6g}" for v in value[:6]) + (", ..." if len(value) > 6 else "")
            parts.append(f"{key} [{shown}]")
        elif isinstance(value, float):
            parts.append(f"{key} {value:.6g}")
        else:
            parts.append(f"{key} {value}")
    return ", ".join(parts) or "no statistics"
