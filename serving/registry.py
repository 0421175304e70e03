"""Loaded SavedModel versions of one model: newest good version serves; new ones load in the background.

Depends on nothing of training: it only reads TF Serving's layout MODEL_BASE/<int version>/.
"""
from __future__ import annotations

import os

import logging
import threading
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from features.errors import RecpipeError
from serving.version import ExportBase

__all__ = ["LoadedVersion", "ModelRegistry", "RequestError", "SIGNATURE", "load_version"]

log = logging.getLogger("recpipe.serving")
SIGNATURE = "serving_default"


class RequestError(RecpipeError, ValueError):
    """The client sent something the model cannot take (HTTP 400 / gRPC INVALID_ARGUMENT)."""


@dataclass
class LoadedVersion:
    version: int
    path: str
    fn: object                       # the serving_default ConcreteFunction
    inputs: dict[str, tf.TensorSpec]
    outputs: list[str]
    signature_defs: object           # tensorflow.core.protobuf.meta_graph_pb2 signature_def map
    loaded: object = None            # the loaded SavedModel object: keeps its variables alive

    def validate(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Columns of a request -> 1-D arrays of the signature's dtypes; RequestError if they do not fit."""
        missing = sorted(set(self.inputs) - set(columns))
        if missing:
            raise RequestError(f"missing input(s): {', '.join(missing)}")
        extra = sorted(set(columns) - set(self.inputs))
        if extra:
            raise RequestError(f"unknown input(s): {', '.join(extra)}; the signature takes {', '.join(self.inputs)}")
        out = {}
        for name, values in columns.items():
            arr = np.asarray(values)
            if arr.ndim != 1:
                raise RequestError(f"input {name!r}: expected one value per row (1-D), got shape {list(arr.shape)}")
            dtype = self.inputs[name].dtype
            if dtype == tf.string:
                if arr.dtype.kind not in "OSU":
                    raise RequestError(f"input {name!r}: expects strings, got {arr.dtype}")
                out[name] = arr.astype(object)
            elif dtype.is_integer:
                if arr.dtype.kind not in "iu":
                    raise RequestError(f"input {name!r}: expects integers, got {arr.dtype}")
                out[name] = arr.astype(dtype.as_numpy_dtype)
            else:
                if arr.dtype.kind not in "iuf":
                    raise RequestError(f"input {name!r}: expects numbers, got {arr.dtype}")
                out[name] = arr.astype(dtype.as_numpy_dtype)
        sizes = {len(v) for v in out.values()}
        if len(sizes) != 1:
            raise RequestError(f"inputs have different batch sizes: {sorted(sizes)}")
        if sizes == {0}:
            raise RequestError("empty batch")
        return out

    def run(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = {k: tf.constant(v, dtype=self.inputs[k].dtype) for k, v in columns.items()}
        out = self.fn(**tensors)
        return {k: v.numpy() for k, v in out.items()}

    def predict(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(self.validate(columns))


def load_version(path: str, version: int) -> LoadedVersion:
    """Load, inspect and warm up one SavedModel version."""
    loaded = tf.saved_model.load(path)
    if SIGNATURE not in loaded.signatures:
        raise ValueError(f"{path}: no {SIGNATURE!r} signature")
    fn = loaded.signatures[SIGNATURE]
    inputs = dict(fn.structured_input_signature[1])
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as fh:
        proto.ParseFromString(fh.read())
    sig_defs = proto.meta_graphs[0].signature_def
    lv = LoadedVersion(version, path, fn, inputs, sorted(fn.structured_outputs), sig_defs, loaded)
    _warm_up(lv)
    return lv


def _warm_up(lv: LoadedVersion) -> None:
    columns = {}
    for name, spec in lv.inputs.items():
        if spec.dtype == tf.string:
            columns[name] = np.array([b""], dtype=object)
        else:
            columns[name] = np.zeros(1, spec.dtype.as_numpy_dtype)
    lv.predict(columns)


class ModelRegistry:
    def __init__(self, model_base: str, model_name: str, poll_seconds: float = 2.0):
        self.base, self.name, self.poll_seconds = model_base, model_name, poll_seconds
        self._lock = threading.Lock()
        self._versions: dict[int, LoadedVersion] = {}
        self._refused: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _on_disk(self) -> list[int]:
        return [v.version for v in ExportBase(self.base).on_disk()]

    def refresh(self) -> None:
        """Load the newest on-disk version if it is new; keep serving the old one if it fails."""
        on_disk = self._on_disk()
        candidates = [v for v in on_disk if v not in self._versions and v not in self._refused]
        if not candidates:
            return
        newest = candidates[-1]
        if self._versions and newest < max(self._versions):
            return
        path = os.path.join(self.base, str(newest))
        try:
            lv = load_version(path, newest)
        except Exception as e:  # a corrupt/partial version must not take the server down
            log.error("refusing %s version %d at %s: %s", self.name, newest, path, e)
            self._refused.add(newest)
            return
        with self._lock:
            self._versions = {newest: lv}
        log.info("serving %s version %d from %s", self.name, newest, path)

    def start(self) -> None:
        self.refresh()
        if not self._versions:
            raise RuntimeError(f"{self.base}: no loadable version of model {self.name!r} "
                               f"(expected {self.base}/<integer version>/saved_model.pb)")

        def loop():
            while not self._stop.wait(self.poll_seconds):
                self.refresh()

        self._thread = threading.Thread(target=loop, name="version-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def get(self, version: int | None = None) -> LoadedVersion:
        with self._lock:
            if version is None:
                return self._versions[max(self._versions)]
            if version not in self._versions:
                raise LookupError(f"Servable not found for request: Specific({self.name}, {version})")
            return self._versions[version]

    def versions(self) -> list[LoadedVersion]:
        with self._lock:
            return [self._versions[v] for v in sorted(self._versions)]
