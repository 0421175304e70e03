"""TF Serving's REST API (v1), an async app served by recpipe.serving.server.http_loop (one event loop).

GET  /v1/models/NAME[/versions/V]            model version status
GET  /v1/models/NAME[/versions/V]/metadata   signature defs, in TF Serving's JSON form
POST /v1/models/NAME[/versions/V]:predict    {"instances": [...]} or {"inputs": {...}}; "signature_name": any
                                             signature of the model (recpipe.serving.server.signatures)
POST /v1/models/NAME[/versions/V]:classify   {"examples": [...], "context": {...}} (recpipe.serving.examples)
POST /v1/models/NAME[/versions/V]:regress    the same body; {"result": [p, ...]}
GET  /healthz                                200 once a version is loaded
GET  /monitoring/prometheus/metrics          requests, latency, batch sizes, time per stage (Prometheus text)
Errors are {"error": "..."} with 400 (bad request), 404 (unknown model/version/path), 411 (no
Content-Length), 413 (too large), 500 (a bug: logged; never a dropped connection); every response
is counted in the metrics with its status.

The loop reads each request completely before the app sees it, so a slow client holds a connection,
not a thread; connections are capped, idle ones closed, and a request that is still incomplete
REQUEST_DEADLINE_S after its first byte (slow-loris) is dropped (recpipe.serving.server.http_loop). JSON, validation
and the response run on the loop; the model call on the batcher's thread (or the loop's executor
without batching), so one thread at a time needs the GIL on a request's path.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from recpipe.features.canonical import DEFAULT_SEPARATOR, FLOAT32_MAX, splits_back, unsplittable_reason
from recpipe.serving.server.batching import Predictor
from recpipe.serving.examples import b64_bytes, classes, examples_from_json, is_b64
from recpipe.serving.server.http_loop import HttpServer, Request, Response
from recpipe.serving.server.limits import IDLE_TIMEOUT_S, MAX_BODY_BYTES, MAX_CONNECTIONS, REQUEST_DEADLINE_S
from recpipe.serving.server.metrics import Metrics
from recpipe.serving.server.registry import SIGNATURE, ModelRegistry, RequestError, dtype_kind
from recpipe.serving.server.signatures import predict_signature, run_signature, signature_inputs

__all__ = ["parse_predict_body", "format_predict_response", "make_rest_server", "RestApp"]

log = logging.getLogger("recpipe.serving")
_PATH = re.compile(r"^/v1/models/(?P<name>[A-Za-z0-9_.\-]+)(?:/versions/(?P<version>\d{1,19}))?"
                   r"(?P<rest>/metadata|:predict|:classify|:regress)?$")
_POST_VERBS = (":predict", ":classify", ":regress")


def _column(name: str, values: list, kind_dtype: tuple[str, object], separator: str | None = DEFAULT_SEPARATOR
            ) -> np.ndarray:
    """JSON values of one input of `kind_dtype` (registry.dtype_kind) -> a numpy column; null/absent means
    missing. `separator`: a row's value may be a list (a multivalent input's items: strings or integers,
    a null item no token), joined by this separator, its feature's, as the graph splits the input; None:
    the input takes no lists."""
    kind, np_dtype = kind_dtype
    if kind == "s":
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(b"")
            elif isinstance(v, str):
                out.append(v.encode("utf-8"))
            elif is_b64(v):
                out.append(b64_bytes(v, f"input {name!r} row {i}"))
            elif isinstance(v, list):
                if separator is None:
                    raise RequestError(f"input {name!r} row {i}: expects one string, got a list (only a multivalent "
                                       f"feature's input takes a list)")
                if not all(x is None or isinstance(x, (str, int)) and not isinstance(x, bool) for x in v):
                    raise RequestError(f"input {name!r} row {i}: list items must be strings or integers")
                if not splits_back(v, separator):  # the Beam job dead-letters such a row (list_item_has_separator)
                    raise RequestError(f"input {name!r} row {i}: {unsplittable_reason(separator)}")
                out.append(separator.join(str(x) for x in v if x is not None).encode("utf-8"))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                raise RequestError(f"input {name!r} row {i}: expects a string, got {v!r}")
            else:
                raise RequestError(f"input {name!r} row {i}: expects a string, got {type(v).__name__}")
        return np.array(out, dtype=object)
    if kind == "i":
        out_i = []
        bounds = np.iinfo(np_dtype)
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int):
                raise RequestError(f"input {name!r} row {i}: expects an integer, got {v!r}")
            if not bounds.min <= v <= bounds.max:
                raise RequestError(f"input {name!r} row {i}: integer out of {bounds.dtype} range")
            out_i.append(v)
        return np.array(out_i, dtype=np_dtype)
    out_f = []
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and v.lower() == "nan"):
            out_f.append(math.nan)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            f = float(v) if isinstance(v, float) or abs(v) <= FLOAT32_MAX else math.inf
            if not (math.isnan(f) or abs(f) <= FLOAT32_MAX):  # as the trainer's data: dead-lettered there
                raise RequestError(f"input {name!r} row {i}: {str(v)[:40]} is not a finite float32 number")
            out_f.append(f)
        else:
            raise RequestError(f"input {name!r} row {i}: expects a number, got {str(v)[:80]!r}")
    return np.array(out_f, dtype=np_dtype)


def parse_predict_body(body: Any, inputs: dict[str, tf.TensorSpec], list_inputs: Mapping[str, str] | None = None,
                       signature: str = SIGNATURE) -> tuple[dict[str, np.ndarray], bool]:
    """Return (columns, row_format). Missing keys/nulls are missing values (not for int inputs).
    list_inputs: {input: its feature's separator} for the inputs whose rows may be lists, joined by it
    (ExportMeta.list_separators; None, a SavedModel without recpipe's metadata: any string input, joined
    by DEFAULT_SEPARATOR). signature: the one whose `inputs` these are; the body's signature_name must
    name it ("" names serving_default)."""
    def column(n: str, values: list) -> np.ndarray:
        separator = DEFAULT_SEPARATOR if list_inputs is None else list_inputs.get(n)
        return _column(n, values, dtype_kind(inputs[n].dtype), separator)

    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    sig = body.get("signature_name", "") or SIGNATURE
    if sig != signature:
        raise RequestError(f"signature {sig!r} not found; this model has {signature!r}")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError("give exactly one of 'instances' (row format) or 'inputs' (columnar format)")
    names = list(inputs)
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list) or not rows:
            raise RequestError("'instances' must be a non-empty list")
        if len(names) == 1 and not all(isinstance(r, dict) and not is_b64(r) for r in rows):  # values, unnamed
            return {names[0]: column(names[0], rows)}, True
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise RequestError(f"instances[{i}] must be an object of input name -> value")
            unknown = sorted(set(r) - set(names))
            if unknown:
                raise RequestError(f"instances[{i}]: unknown input {unknown[0]!r}")
        cols = {}
        for n in names:
            values = [r.get(n) for r in rows]
            if dtype_kind(inputs[n].dtype)[0] == "i" and any(v is None for v in values):
                i = next(i for i, v in enumerate(values) if v is None)
                raise RequestError(f"instances[{i}]: integer input {n!r} is missing")
            cols[n] = column(n, values)
        return cols, True
    cols_in = body["inputs"]
    if not isinstance(cols_in, dict):
        if len(names) == 1 and isinstance(cols_in, list):
            cols_in = {names[0]: cols_in}
        else:
            raise RequestError("'inputs' must be an object of input name -> list of values")
    unknown = sorted(set(cols_in) - set(names))
    if unknown:
        raise RequestError(f"inputs: unknown input {unknown[0]!r}")
    missing = [n for n in names if n not in cols_in]
    if missing:
        raise RequestError(f"inputs: missing input {missing[0]!r}")
    cols = {}
    for n in names:
        values = cols_in[n]
        if not isinstance(values, list):
            raise RequestError(f"inputs[{n!r}] must be a list (one value per row)")
        cols[n] = column(n, values)
    if len({len(c) for c in cols.values()}) > 1:
        raise RequestError("inputs: all inputs need the same number of rows")
    if not next(iter(cols.values())).size:
        raise RequestError("inputs: empty batch")
    return cols, False


def _decode(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, list):
        return [_decode(v) for v in x]
    return x


def _jsonable(a: np.ndarray) -> Any:
    return _decode(a.tolist()) if a.dtype == object else a.tolist()


def format_predict_response(outputs: dict[str, np.ndarray], row_format: bool) -> dict:
    """TF Serving's shapes: one output -> its values unnamed; several -> named."""
    if row_format:
        if len(outputs) == 1:
            return {"predictions": _jsonable(next(iter(outputs.values())))}
        n = len(next(iter(outputs.values())))
        return {"predictions": [{k: _jsonable(v[i:i + 1])[0] for k, v in outputs.items()} for i in range(n)]}
    if len(outputs) == 1:
        return {"outputs": _jsonable(next(iter(outputs.values())))}
    return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}


def model_status(registry: ModelRegistry, version: int | None) -> dict:
    versions = registry.versions() if version is None else [registry.get(version)]
    return {"model_version_status": [{"version": str(v.version), "state": "AVAILABLE",
                                      "status": {"error_code": "OK", "error_message": ""}} for v in versions]}


def model_metadata(registry: ModelRegistry, version: int | None) -> dict:
    lv = registry.get(version)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    for k, v in lv.signature_defs.items():
        sig_map.signature_def[k].CopyFrom(v)
    return {"model_spec": {"name": registry.name, "signature_name": "", "version": str(lv.version)},
            "metadata": {"signature_def": json_format.MessageToDict(sig_map, preserving_proto_field_name=True)}}


class RestApp:
    """TF Serving's REST routes over one registry, as an async app of recpipe.serving.server.http_loop: it runs on the
    loop thread; a model call waits for the batcher (or the loop's executor), so the loop serves others."""

    def __init__(self, registry: ModelRegistry, predictor: Predictor, metrics: Metrics):
        self.registry, self.predictor, self.metrics = registry, predictor, metrics

    async def __call__(self, request: Request) -> Response:
        t0 = time.perf_counter()
        verb = request.path.rpartition(":")[2]
        verb = verb if verb in ("classify", "regress") else "predict"
        api = f"rest_{verb}" if request.method == "POST" else "rest_get"
        try:
            code, body, content_type = await self._handle(request)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug: answered and counted as 500, logged with its traceback
            log.exception("REST %s %s failed", request.method, request.path)
            code, body, content_type = 500, {"error": "internal server error"}, "application/json"
        data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode("utf-8")
        self.metrics.request(api, str(code), time.perf_counter() - t0 + request.read_s)  # read: before the app
        return Response(code, content_type, data)

    def _route(self, path: str):
        m = _PATH.match(path)
        if not m:
            return None
        if m["name"] != self.registry.name:
            raise LookupError(f"Servable not found for request: Latest({m['name']})")
        return m["version"] and int(m["version"]), m["rest"]

    async def _handle(self, request: Request) -> tuple[int, Any, str]:
        if request.reject is not None:
            return request.reject[0], {"error": request.reject[1]}, "application/json"
        try:
            if request.method == "GET":
                return self._get(request.path)
            if request.method == "POST":
                return await self._post(request)
            return 405, {"error": f"method {request.method} not allowed"}, "application/json"
        except RequestError as e:
            return 400, {"error": str(e)}, "application/json"
        except LookupError as e:
            return 404, {"error": str(e).strip("'\"")}, "application/json"

    def _get(self, path: str) -> tuple[int, Any, str]:
        if path == "/healthz":
            if not self.registry.healthy():
                return 503, {"status": "unhealthy", "error": self.registry.health_problem()}, "application/json"
            return 200, {"status": "ok", "version": self.registry.get().version}, "application/json"
        if path == "/monitoring/prometheus/metrics":
            self.metrics.version(self.registry.name, self.registry.get().version)
            return 200, self.metrics.render(), self.metrics.content_type
        route = self._route(path)
        if route is None or route[1] in _POST_VERBS:
            return 404, {"error": f"unknown path {path}"}, "application/json"
        version, rest = route
        body = model_metadata(self.registry, version) if rest == "/metadata" else model_status(self.registry, version)
        return 200, body, "application/json"

    async def _post(self, request: Request) -> tuple[int, Any, str]:
        self.metrics.stage("read", request.read_s)
        route = self._route(request.path)
        if route is None or route[1] not in _POST_VERBS:
            return 404, {"error": f"unknown path {request.path}"}, "application/json"
        lv = self.registry.get(route[0])
        t0 = time.perf_counter()
        try:
            body = json.loads(request.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"JSON parse error: {e}") from None
        except RecursionError:
            raise RequestError("JSON nested too deeply") from None
        if route[1] != ":predict":
            examples = examples_from_json(body)
            scores = await asyncio.get_running_loop().run_in_executor(None, lv.score_examples, examples)
            result = classes(scores) if route[1] == ":classify" else [float(p) for p in scores]
            return 200, {"result": result}, "application/json"
        try:
            requested = body.get("signature_name", "") if isinstance(body, dict) else ""
            if not isinstance(requested, str):
                raise RequestError("'signature_name' must be a string")
            signature = predict_signature(lv, requested)  # any signature of the model, as TF Serving
            cols, row_format = parse_predict_body(body, signature_inputs(lv, signature), lv.list_inputs, signature)
            self.metrics.stage("parse", time.perf_counter() - t0)
            if signature == SIGNATURE:
                outputs = await self.predictor.predict_async(lv, cols)
            else:
                outputs = await asyncio.get_running_loop().run_in_executor(None, run_signature, lv, signature, cols)
            t0 = time.perf_counter()
            data = json.dumps(format_predict_response(outputs, row_format), allow_nan=True).encode("utf-8")
            self.metrics.stage("respond", time.perf_counter() - t0)
            return 200, data, "application/json"
        except (tf.errors.InvalidArgumentError, ValueError, TypeError, OverflowError) as e:
            if isinstance(e, RequestError):
                raise
            return 400, {"error": f"{type(e).__name__}: {e}".splitlines()[0]}, "application/json"


def make_rest_server(registry: ModelRegistry, predictor: Predictor, metrics: Metrics, host: str, port: int,
                     threads: int = 8, request_deadline_s: float = REQUEST_DEADLINE_S,
                     idle_timeout_s: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> HttpServer:
    """threads: the executor's, for model calls without batching and tf.Example scoring (the loop itself
    is one thread)."""
    return HttpServer(RestApp(registry, predictor, metrics), host, port, threads=threads,
                      request_deadline_s=request_deadline_s, idle_timeout_s=idle_timeout_s,
                      max_connections=max_connections, max_body_bytes=MAX_BODY_BYTES)
