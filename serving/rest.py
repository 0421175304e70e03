"""TF Serving's REST API (v1) over the standard library's threading HTTP server.

GET  /v1/models/NAME[/versions/V]            model version status
GET  /v1/models/NAME[/versions/V]/metadata   signature defs, in TF Serving's JSON form
POST /v1/models/NAME[/versions/V]:predict    {"instances": [...]} or {"inputs": {...}}
GET  /healthz                                200 once a version is loaded
GET  /monitoring/prometheus/metrics          requests, latency histogram, batch sizes (Prometheus text)
Errors are {"error": "..."} with 400 (bad request), 404 (unknown model/version/path), 413 (too large).
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2

from serving.batching import Predictor
from serving.metrics import LATENCY_BUCKETS_S, Metrics
from serving.registry import SIGNATURE, ModelRegistry, RequestError

__all__ = ["parse_predict_body", "format_predict_response", "make_rest_server", "MAX_BODY_BYTES"]

log = logging.getLogger("recpipe.serving")
MAX_BODY_BYTES = 16 * 1024 * 1024
_PATH = re.compile(r"^/v1/models/(?P<name>[A-Za-z0-9_.\-]+)(?:/versions/(?P<version>\d{1,19}))?"
                   r"(?P<rest>/metadata|:predict)?$")


def _column(name: str, values: list, spec: tf.TensorSpec) -> np.ndarray:
    """JSON values of one input -> a numpy column; null/absent means missing."""
    if spec.dtype == tf.string:
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(b"")
            elif isinstance(v, str):
                out.append(v.encode("utf-8"))
            elif isinstance(v, dict) and set(v) == {"b64"}:
                import base64
                out.append(base64.b64decode(v["b64"]))
            elif isinstance(v, list):
                if not all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v):
                    raise RequestError(f"input {name!r} row {i}: list items must be strings or integers")
                out.append("|".join(str(x) for x in v).encode("utf-8"))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                raise RequestError(f"input {name!r} row {i}: expects a string, got {v!r}")
            else:
                raise RequestError(f"input {name!r} row {i}: expects a string, got {type(v).__name__}")
        return np.array(out, dtype=object)
    if spec.dtype.is_integer:
        out_i = []
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int):
                raise RequestError(f"input {name!r} row {i}: expects an integer, got {v!r}")
            if not -(2 ** 63) <= v < 2 ** 63:
                raise RequestError(f"input {name!r} row {i}: integer out of int64 range")
            out_i.append(v)
        return np.array(out_i, dtype=spec.dtype.as_numpy_dtype)
    out_f = []
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and v.lower() == "nan"):
            out_f.append(math.nan)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out_f.append(float(v))
        else:
            raise RequestError(f"input {name!r} row {i}: expects a number, got {v!r}")
    return np.array(out_f, dtype=spec.dtype.as_numpy_dtype)


def parse_predict_body(body: Any, inputs: dict[str, tf.TensorSpec]) -> tuple[dict[str, np.ndarray], bool]:
    """Return (columns, row_format). Missing keys/nulls are missing values (not for int inputs)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    sig = body.get("signature_name", SIGNATURE)
    if sig not in (SIGNATURE, ""):
        raise RequestError(f"signature {sig!r} not found; this model has {SIGNATURE!r}")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError("give exactly one of 'instances' (row format) or 'inputs' (columnar format)")
    names = list(inputs)
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list) or not rows:
            raise RequestError("'instances' must be a non-empty list")
        if len(names) == 1 and not all(isinstance(r, dict) for r in rows):
            return {names[0]: _column(names[0], rows, inputs[names[0]])}, True
        for i, r in enumerate(rows):
            if not isinstance(r, dict):
                raise RequestError(f"instances[{i}] must be an object of input name -> value")
            unknown = sorted(set(r) - set(names))
            if unknown:
                raise RequestError(f"instances[{i}]: unknown input {unknown[0]!r}")
        cols = {}
        for n in names:
            values = [r.get(n) for r in rows]
            if inputs[n].dtype.is_integer and any(v is None for v in values):
                i = next(i for i, v in enumerate(values) if v is None)
                raise RequestError(f"instances[{i}]: integer input {n!r} is missing")
            cols[n] = _column(n, values, inputs[n])
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
        cols[n] = _column(n, values, inputs[n])
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


class _Handler(BaseHTTPRequestHandler):
    registry: ModelRegistry
    predictor: Predictor
    metrics: Metrics
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stops sending mid-request frees its worker thread
    # Headers and body go out as two writes; with Nagle on, the body waited for the client's delayed
    # ACK: 48 ms per request at concurrency 1 (measured by `recpipe bench serve`).
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # route access logs to logging, not stderr
        log.debug("%s - %s", self.address_string(), fmt % args)

    def _send(self, code: int, payload: dict | str, content_type: str = "application/json") -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload, allow_nan=True)).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._code = code

    def _route(self):
        m = _PATH.match(self.path.split("?", 1)[0])
        if not m:
            return None
        if m["name"] != self.registry.name:
            raise LookupError(f"Servable not found for request: Latest({m['name']})")
        return m["version"] and int(m["version"]), m["rest"]

    def _observe(self, api: str, t0: float) -> None:
        code = str(getattr(self, "_code", 0))
        self.metrics.inc("recpipe_requests_total", "Requests by API and HTTP status.", api=api, code=code)
        self.metrics.observe("recpipe_request_latency_seconds", "Request latency.", time.perf_counter() - t0,
                             LATENCY_BUCKETS_S, api=api)

    def do_GET(self):
        t0 = time.perf_counter()
        try:
            self._get()
        finally:
            self._observe("rest_get", t0)

    def _get(self):
        try:
            if self.path == "/healthz":
                return self._send(200, {"status": "ok", "version": self.registry.get().version})
            if self.path == "/monitoring/prometheus/metrics":
                self.metrics.set("recpipe_model_version", "Version being served.", self.registry.get().version,
                                 model=self.registry.name)
                return self._send(200, self.metrics.render(), "text/plain; version=0.0.4")
            route = self._route()
            if route is None or route[1] == ":predict":
                return self._send(404, {"error": f"unknown path {self.path}"})
            version, rest = route
            body = model_metadata(self.registry, version) if rest == "/metadata" else model_status(self.registry, version)
            self._send(200, body)
        except LookupError as e:
            self._send(404, {"error": str(e).strip("'\"")})

    def do_POST(self):
        t0 = time.perf_counter()
        try:
            self._post()
        finally:
            self._observe("rest_predict", t0)

    def _post(self):
        try:
            length = int(self.headers.get("Content-Length") or -1)
        except ValueError:
            length = -1
        if length < 0:
            return self._send(411, {"error": "Content-Length required"})
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._send(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"})
        raw = self.rfile.read(length)
        try:
            route = self._route()
            if route is None or route[1] != ":predict":
                return self._send(404, {"error": f"unknown path {self.path}"})
            lv = self.registry.get(route[0])
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"JSON parse error: {e}") from None
            cols, row_format = parse_predict_body(body, lv.inputs)
            self._send(200, format_predict_response(self.predictor.predict(lv, cols), row_format))
        except RequestError as e:
            self._send(400, {"error": str(e)})
        except LookupError as e:
            self._send(404, {"error": str(e).strip("'\"")})
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            self._send(400, {"error": f"{type(e).__name__}: {e}".splitlines()[0]})


def make_rest_server(registry: ModelRegistry, predictor: Predictor, metrics: Metrics, host: str,
                     port: int) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"registry": registry, "predictor": predictor, "metrics": metrics})
    server = _Server((host, port), handler)
    server.daemon_threads = True
    return server


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: 32 clients connecting at once got connection
    # resets (found by `recpipe bench serve`).
    request_queue_size = 1024
