"""Loaded SavedModel versions of one model: newest good version serves; new ones load in the background.

Depends on nothing of training: it only reads TF Serving's layout EXPORT_BASE/<int version>/.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from recpipe.common.hostmem import GIB, available_memory
from recpipe.serving.errors import RequestError
from recpipe.serving.version import EXAMPLES_INPUT, EXAMPLES_SIGNATURE, SIGNATURE, ExportBase, ExportedVersion
from recpipe.serving.warmup import missing_rows, read_warmup, replay

__all__ = ["LoadedVersion", "ModelRegistry", "RequestError", "SIGNATURE", "EXAMPLES_SIGNATURE", "load_version",
           "dtype_kind", "graph_error"]

log = logging.getLogger("recpipe.serving")


@functools.lru_cache(maxsize=None)
def dtype_kind(dtype: tf.DType) -> tuple[str, object]:
    """An input dtype as ("s"|"i"|"f", its numpy dtype or None for strings), asked per request column:
    cached, as comparing TensorFlow DTypes costs microseconds each time."""
    if dtype == tf.string:
        return "s", None
    return ("i" if dtype.is_integer else "f"), dtype.as_numpy_dtype


@dataclass
class LoadedVersion:
    version: int
    path: str
    fn: object                       # the serving_default ConcreteFunction
    inputs: dict[str, tf.TensorSpec]
    outputs: list[str]
    signature_defs: object           # tensorflow.core.protobuf.meta_graph_pb2 signature_def map
    loaded: object = None            # the loaded SavedModel object: keeps its variables alive
    examples_fn: object = None       # the predict_examples ConcreteFunction (ranking exports), else None
    list_inputs: Optional[dict] = None  # input -> separator: the inputs a list per row may feed; None: any string one
    _kinds: dict = field(init=False, repr=False)  # input -> ("s"|"i"|"f", numpy dtype), read per request
    _groups: list = field(init=False, repr=False)  # [(dtype, [input names])]: one block per dtype
    _packed: object = field(init=False, repr=False)  # ConcreteFunction of the blocks -> [outputs]

    def __post_init__(self):
        self._kinds = {n: dtype_kind(spec.dtype) for n, spec in self.inputs.items()}
        by_dtype: dict[tf.DType, list[str]] = {}
        for name in sorted(self.inputs):
            by_dtype.setdefault(self.inputs[name].dtype, []).append(name)
        self._groups = list(by_dtype.items())
        self._packed = _packed_function(self.fn, self._groups, self.outputs)

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
            kind, np_dtype = self._kinds[name]
            if kind == "s":
                if arr.dtype.kind not in "OSU":
                    raise RequestError(f"input {name!r}: expects strings, got {arr.dtype}")
                out[name] = arr.astype(object, copy=False)
            elif kind == "i":
                if arr.dtype.kind not in "iu":
                    raise RequestError(f"input {name!r}: expects integers, got {arr.dtype}")
                if arr.dtype != np_dtype:  # a cast would wrap a value beyond the input's range around, silently
                    bounds = np.iinfo(np_dtype)
                    outside = (arr < bounds.min) | (arr > bounds.max)
                    if outside.any():
                        row = int(np.argmax(outside))
                        raise RequestError(f"input {name!r} row {row}: {arr[row]} is out of {bounds.dtype} range")
                out[name] = arr.astype(np_dtype, copy=False)
            else:
                if arr.dtype.kind not in "iuf":
                    raise RequestError(f"input {name!r}: expects numbers, got {arr.dtype}")
                if arr.dtype == np_dtype:  # a REST column arrives so: nothing to cast
                    cast = arr
                else:
                    with np.errstate(over="ignore"):
                        cast = arr.astype(np_dtype)  # beyond float32 -> inf; NaN (missing) stays NaN
                if np.isinf(cast).any():  # inf, or finite beyond float32: the trainer's data never has them
                    row = int(np.argmax(np.isinf(cast)))
                    raise RequestError(f"input {name!r} row {row}: {arr[row]} is not a finite float32 number "
                                       f"(the trainer's data dead-letters such values)")
                out[name] = cast
        sizes = {len(v) for v in out.values()}
        if len(sizes) != 1:
            raise RequestError(f"inputs have different batch sizes: {sorted(sizes)}")
        if sizes == {0}:
            raise RequestError("empty batch")
        return out

    def run(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validated columns -> the signature's outputs, in one call of the packed function: one tensor
        per dtype (a [rows, inputs] block) and one function execution, so a call crosses into TensorFlow
        as few times as it can (see _packed_function)."""
        blocks = [tf.constant(columns[names[0]] if len(names) == 1 else np.stack([columns[n] for n in names], axis=1),
                              dtype=dtype) for dtype, names in self._groups]
        out = self._packed._call_flat(blocks, self._packed.captured_inputs)  # noqa: SLF001
        return {k: v.numpy() for k, v in zip(self.outputs, out)}

    def predict(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(self.validate(columns))

    def score_examples(self, serialized: list[bytes]) -> np.ndarray:
        """Scores of serialized tf.Examples (TF Serving's classify/regress); RequestError when this
        version has no predict_examples signature or an Example does not fit it."""
        if self.examples_fn is None:
            raise RequestError(f"version {self.version} has no {EXAMPLES_SIGNATURE!r} signature (classify/regress "
                               f"serve ranking models exported by this recpipe)")
        if not serialized:
            raise RequestError("empty batch: no examples")
        try:
            out = self.examples_fn(**{EXAMPLES_INPUT: tf.constant(serialized, tf.string)})
        except tf.errors.InvalidArgumentError as e:
            raise RequestError(f"examples: {graph_error(e.message)}") from None
        return out["score"].numpy()


def _packed_function(fn, groups: list, outputs: list[str]):
    """The signature `fn` behind one argument per dtype: a [rows, inputs] block (or the one input's
    column) that the graph splits into fn's inputs. The server calls it through its flat entry point
    with tensors validate() has checked. Why: every eager op and every keyword argument a call binds in
    Python costs tens of microseconds, and under load each release of the GIL around an eager op waits
    for the other threads (the REST event loop, gRPC's) to hand it back; with the 42 raw columns of the
    synthetic model the per-input call spent about half of a one-row call there."""
    specs = [tf.TensorSpec([None] if len(names) == 1 else [None, len(names)], dtype) for dtype, names in groups]

    @tf.function(input_signature=specs, autograph=False)
    def packed(*blocks):
        kwargs = {}
        for (_, names), block in zip(groups, blocks):
            kwargs.update({names[0]: block} if len(names) == 1 else zip(names, tf.unstack(block, len(names), axis=1)))
        out = fn(**kwargs)
        return [out[k] for k in outputs]

    return packed.get_concrete_function()


def graph_error(message: str) -> str:
    """The cause in a graph op's error text (a failed assertion's message, a parse error), without
    TensorFlow's framing ("Graph execution error", "Detected at node", the node list)."""
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("assertion failed: ["):  # its data: "[message] [values]", each in brackets
            parts = re.findall(r"\[([^\[\]]*)\]", line[len("assertion failed: "):])
            if parts and parts[1:2] == ["Condition x == y did not hold element-wise:"]:
                parts = parts[:1]  # assert_equal's own framing after the message
            return " ".join(parts).replace("\\'", "'")
        if line and not line.startswith(("Graph execution error", "Detected at node", "<stack traces", "[[")):
            return line.replace("Name: <unknown>, ", "")
    return message.splitlines()[0] if message else "invalid examples"


def load_version(path: str, version: int, loaded=None) -> LoadedVersion:
    """Load, inspect and warm up one SavedModel version; `loaded`: the SavedModel at `path`, loaded already
    (the export's check, which must not hold a second copy of a large model's weights)."""
    loaded = loaded if loaded is not None else tf.saved_model.load(path)
    if SIGNATURE not in loaded.signatures:
        raise ValueError(f"{path}: no {SIGNATURE!r} signature")
    fn = loaded.signatures[SIGNATURE]
    inputs = dict(fn.structured_input_signature[1])
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as fh:
        proto.ParseFromString(fh.read())
    sig_defs = proto.meta_graphs[0].signature_def
    meta = ExportedVersion(path, version).meta()  # None: a SavedModel exported by something else
    lv = LoadedVersion(version, path, fn, inputs, sorted(fn.structured_outputs), sig_defs, loaded,
                       loaded.signatures.get(EXAMPLES_SIGNATURE), meta.list_separators() if meta else None)
    warmup = ExportedVersion(path, version).warmup_path
    if os.path.exists(warmup):  # as TF Serving: the version's own requests, each run once before it serves
        logs = read_warmup(warmup)
        replay(lv, logs, warmup)
        log.info("version %d: replayed %d warmup request(s) from %s", version, len(logs), warmup)
    else:
        _warm_up(lv)
    return lv


def _warm_up(lv: LoadedVersion) -> None:
    """A version without warmup requests (exported by something else, or before they were written): one
    all-missing row through each signature, so the first real request does not run the graph first."""
    lv.predict(missing_rows(lv.inputs, 1))
    if lv.examples_fn is not None:
        lv.score_examples([b""])  # an empty tf.Example: every feature absent, a missing value


# TF Serving's estimate of a SavedModel's RAM: its bytes on disk x 1.2 (ResourceUtil's RAM multiplier)
RAM_PER_DISK_BYTE = 1.2


def memory_refusal(v: ExportedVersion, current: int) -> Optional[str]:
    """Why version v must not be loaded now, or None: the RAM it would take (TF Serving's estimate) is more
    than the process can still get. The served version stays loaded while the new one loads, so both must
    fit; one that cannot would get the whole server killed for memory, the version it serves with it."""
    disk = v.disk_bytes()
    need, (available, source) = int(disk * RAM_PER_DISK_BYTE), available_memory()
    if need <= available:
        return None
    serving = f"version {current} keeps serving" if current else "nothing is served until one fits"
    return (f"loading it would take about {need / GIB:.2f} GiB ({RAM_PER_DISK_BYTE:g} x its {disk / GIB:.2f} GiB "
            f"on disk, as TF Serving estimates), more than the {available / GIB:.2f} GiB available ({source}); "
            f"not loaded, so the server is not killed for memory: {serving}")


@dataclass
class _Refusal:
    signature: tuple      # the version folder's files when it was refused
    retry_at: float       # monotonic time of the next attempt if the files do not change
    backoff_s: float


class ModelRegistry:
    """The served version of one model: the newest loadable version in EXPORT_BASE.

    At start the newest version that loads is served (newer ones that fail are refused and logged); a
    watcher thread then loads newer versions in the background and swaps when one is ready. A refused
    version is tried again when its files change (a copy still in progress) or after a back-off doubling
    from RETRY_S to MAX_RETRY_S, so a version copied in non-atomically is served once it is complete and
    never before. When the served version's folder disappears, the newest remaining version that loads is
    served. The watcher survives any error (logged); healthy() is False if it is gone.
    """
    RETRY_S, MAX_RETRY_S = 5.0, 300.0

    def __init__(self, export_base: str, model_name: str, poll_seconds: float = 2.0):
        self.base, self.name, self.poll_seconds = export_base, model_name, poll_seconds
        self._lock = threading.Lock()
        self._versions: dict[int, LoadedVersion] = {}
        self._refused: dict[int, _Refusal] = {}
        self._gone_reported = False  # the served version's folder is gone and nothing else loads: logged once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _may_try(self, v: ExportedVersion) -> bool:
        refusal = self._refused.get(v.version)
        return refusal is None or refusal.signature != v.files_signature() or time.monotonic() >= refusal.retry_at

    def _refuse(self, v: ExportedVersion, error: Exception) -> None:
        previous = self._refused.get(v.version)
        backoff = min(previous.backoff_s * 2, self.MAX_RETRY_S) if previous else self.RETRY_S
        self._refused[v.version] = _Refusal(v.files_signature(), time.monotonic() + backoff, backoff)
        log.error("refusing %s version %d at %s (retried when its files change, or in %.0f s): %s",
                  self.name, v.version, v.path, backoff, error)

    def refresh(self) -> None:
        """Serve the newest version newer than the current one that loads; keep the current one otherwise.
        When the current version's folder is gone (a rollback deletes it), serve the newest remaining
        version that loads, as TF Serving's latest-version policy does; with none, keep the current one
        (logged once)."""
        current = max(self._versions) if self._versions else 0
        on_disk = ExportBase(self.base).on_disk()
        gone = bool(current) and all(v.version != current for v in on_disk)
        for v in reversed(on_disk):
            if v.version <= (0 if gone else current):
                return
            if not self._may_try(v):
                continue
            too_big = memory_refusal(v, current)
            if too_big:
                self._refuse(v, MemoryError(too_big))
                continue
            try:
                lv = load_version(v.path, v.version)
            except Exception as e:  # noqa: BLE001 - a corrupt/partial version must not take the server down
                self._refuse(v, e)
                continue
            self._refused.pop(v.version, None)
            with self._lock:
                self._versions = {v.version: lv}
            self._gone_reported = False
            log.info("serving %s version %d from %s%s", self.name, v.version, v.path,
                     f" (version {current}'s folder is gone)" if gone else "")
            return
        if gone and not self._gone_reported:
            self._gone_reported = True
            log.error("%s version %d's folder is gone and no other version loads: still serving it from memory",
                      self.name, current)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - e.g. the export base vanished for a moment: keep watching
                log.exception("version watcher: refresh failed; serving version %s", self.get().version)

    def start(self) -> None:
        self.refresh()
        if not self._versions:
            raise RuntimeError(f"{self.base}: no loadable version of model {self.name!r} "
                               f"(expected {self.base}/<integer version>/saved_model.pb)")
        self._thread = threading.Thread(target=self._watch, name="version-watcher", daemon=True)
        self._thread.start()

    def healthy(self) -> bool:
        return bool(self._versions) and self._thread is not None and self._thread.is_alive()

    def health_problem(self) -> str:
        if not self._versions:
            return "no version loaded"
        return "the version watcher has stopped: new versions would not be picked up"

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
