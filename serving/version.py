"""TF Serving's versioned layout, as recpipe writes and reads it.

    BASE/<version>/saved_model.pb, variables/   the SavedModel (any TF Serving-compatible export)
    BASE/<version>/assets.extra/recpipe.json    ExportMeta: config, raw schema, model dir, metrics, weight dtypes
    BASE/<version>/assets.extra/tf_serving_warmup_requests  requests replayed before the version serves
    BASE/<version>/skew_check.json              the export's skew-check report

A version is a folder named by a positive integer in ASCII digits; anything else in BASE (temp
folders, '²', 'latest', ...) is not a version and is ignored.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional, get_args

from recpipe.common import fsio
from recpipe.common.dirlock import DirLock
from recpipe.features.canonical import list_separators
from recpipe.features.config import Config, parse_config

__all__ = ["ExportBase", "ExportedVersion", "ExportMeta", "is_version_name", "TEMP_PREFIX", "SIGNATURE",
           "EXAMPLES_SIGNATURE", "EXAMPLES_INPUT", "WeightDtype", "WEIGHT_DTYPES"]

SIGNATURE = "serving_default"           # raw columns in (predict)
EXAMPLES_SIGNATURE = "predict_examples"  # ranking: serialized tf.Examples of raw columns in (classify/regress)
EXAMPLES_INPUT = "examples"  # predict_examples' one input: a vector of serialized tf.Examples

WeightDtype = Literal["float32", "bfloat16", "int8"]  # how an export stores embedding tables / Dense kernels
WEIGHT_DTYPES: tuple[str, ...] = get_args(WeightDtype)

_VERSION = re.compile(r"[0-9]{1,19}")
TEMP_PREFIX = ".tmp-"  # BASE/.tmp-<version>-<pid>-<random>: an export in progress


def is_version_name(name: str) -> bool:
    return bool(_VERSION.fullmatch(name)) and 0 < int(name) < 2 ** 63


@dataclass(frozen=True)
class ExportMeta:
    config: dict[str, Any]               # the transform artifact's config (config_to_dict form)
    raw_schema: dict[str, str]
    model_dir: str
    version: int
    metrics: dict[str, Any] = field(default_factory=dict)  # the model's eval metrics, when known
    weights: dict[str, Any] = field(default_factory=dict)  # recpipe.serving.export.quantize: stored dtypes, tables/layers swapped

    def typed_config(self) -> Config:
        return parse_config(self.config)

    def list_separators(self) -> dict[str, str]:
        """The raw columns a multivalent feature reads, the only inputs whose request values may be lists.

        Returns:
            {column: its feature's separator}, which a list is joined by and the graph splits on.
        """
        return list_separators(self.typed_config())

    @classmethod
    def from_dict(cls, data: dict) -> "ExportMeta":
        return cls(data["config"], data["raw_schema"], data["model_dir"], int(data["version"]),
                   data.get("metrics") or {}, data.get("weights") or {})


@dataclass(frozen=True)
class ExportedVersion:
    """One version folder of an export base (BASE/<version>/, the layout above), complete or not.

    Attributes:
        path: the version's folder (BASE/<version>), on the local file system.
        version: the version number (the folder's name).
    """
    path: str
    version: int

    saved_model_pb = fsio.SubPath("saved_model.pb")
    variables_index = fsio.SubPath("variables", "variables.index")
    meta_path = fsio.SubPath("assets.extra", "recpipe.json")
    warmup_path = fsio.SubPath("assets.extra", "tf_serving_warmup_requests")  # recpipe.serving.warmup
    skew_report_path = fsio.SubPath("skew_check.json")

    @property
    def root(self) -> str:
        return self.path

    def is_complete(self) -> bool:
        """Whether the version can be loaded (a copy in progress usually lacks one of its files).

        Returns:
            True when saved_model.pb and variables/variables.index are both there.
        """
        return os.path.isfile(self.saved_model_pb) and os.path.isfile(self.variables_index)

    def meta(self) -> Optional[ExportMeta]:
        """recpipe's metadata (assets.extra/recpipe.json).

        Returns:
            The ExportMeta, or None when the file is absent (a SavedModel exported by something else).

        Raises:
            ValueError: the file holds no valid JSON.
            KeyError: the file lacks one of config, raw_schema, model_dir or version.
        """
        return ExportMeta.from_dict(fsio.read_json(self.meta_path)) if os.path.exists(self.meta_path) else None

    def write_meta(self, meta: ExportMeta) -> None:
        """Write recpipe's metadata to assets.extra/recpipe.json, creating assets.extra/ if need be.

        Args:
            meta: the ExportMeta of this version.
        """
        os.makedirs(os.path.dirname(self.meta_path), exist_ok=True)
        fsio.write_json(self.meta_path, asdict(meta), sort_keys=False)

    def skew_report(self) -> dict:
        """The export's skew-check report (skew_check.json).

        Returns:
            The report as written by write_skew_report.

        Raises:
            FileNotFoundError: the version has no skew_check.json.
            ValueError: the file holds no valid JSON.
        """
        return fsio.read_json(self.skew_report_path)

    def write_skew_report(self, report: dict) -> None:
        """Write the export's skew-check report to skew_check.json (atomically).

        Args:
            report: the report, JSON-serialisable.
        """
        fsio.write_json(self.skew_report_path, report, sort_keys=False)

    def files_signature(self) -> tuple:
        """A fingerprint of the version's files, which changes while a copy is in progress.

        Returns:
            Sorted (path relative to the version folder, size in bytes, mtime in ns) of every file under it;
            files that vanish while it is walked are left out.
        """
        out = []
        for root, _, names in os.walk(self.path):
            for n in names:
                p = os.path.join(root, n)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                out.append((os.path.relpath(p, self.path), st.st_size, st.st_mtime_ns))
        return tuple(sorted(out))

    def disk_bytes(self) -> int:
        """The size of the version on disk (what loading it reads).

        Returns:
            The sum of the sizes, in bytes, of every file under the version folder.
        """
        return sum(size for _, size, _ in self.files_signature())


@dataclass(frozen=True)
class ExportBase:
    root: str

    def version(self, version: int) -> ExportedVersion:
        return ExportedVersion(os.path.join(self.root, str(version)), version)

    def on_disk(self) -> list[ExportedVersion]:
        """Every folder named like a version, complete or not, oldest first."""
        if not os.path.isdir(self.root):
            return []
        return [self.version(v) for v in sorted(int(d) for d in os.listdir(self.root) if is_version_name(d))]

    def versions(self) -> list[ExportedVersion]:
        """The complete versions, oldest first."""
        return [v for v in self.on_disk() if v.is_complete()]

    def writer_lock(self, wait_s: float = 0.0) -> DirLock:
        """The lock an export holds while it picks and publishes a version, so two exports never pick the
        same version: a hidden file beside ROOT (.NAME.lock), leaving ROOT to the versions TF Serving reads.

        Args:
            wait_s: how long to wait for another export to finish; 0 fails at once.

        Returns:
            A DirLock context manager; entering it raises FolderInUseError naming the holder.
        """
        return DirLock.beside(self.root, f"export base {self.root}", wait_s)

    def next_version(self) -> int:
        """Epoch seconds, above any existing version."""
        existing = self.on_disk()
        now = int(time.time())
        return max(now, existing[-1].version + 1) if existing else now

    def remove_stale_temp(self) -> list[str]:
        """Temp folders of exports whose process is gone (killed mid-export); returns them."""
        removed = []
        for name in os.listdir(self.root) if os.path.isdir(self.root) else []:
            parts = name[len(TEMP_PREFIX):].split("-")
            if name.startswith(TEMP_PREFIX) and len(parts) == 3 and parts[1].isdigit() \
                    and int(parts[1]) != os.getpid() and not os.path.exists(f"/proc/{parts[1]}"):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
                removed.append(os.path.join(self.root, name))
        return removed

    def find_model_dir(self, model_dir: str) -> Optional[ExportedVersion]:
        """The version exported from `model_dir`, if any (a day's model is pushed at most once)."""
        for v in self.versions():
            meta = v.meta()
            if meta is not None and meta.model_dir == os.path.abspath(model_dir):
                return v
        return None
