"""TF Serving's gRPC API on the official tensorflow-serving-api protos.

PredictionService.Predict / Classify / Regress / GetModelMetadata and ModelService.GetModelStatus, so
a client built on `prediction_service_pb2_grpc.PredictionServiceStub` works unchanged (Classify and
Regress: recpipe.serving.examples). Predict runs any signature of the model and honours output_filter
(recpipe.serving.server.signatures), with TF Serving's status codes.
"""
from __future__ import annotations

import time
from concurrent import futures

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                     model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc,
                                     regression_pb2)

from recpipe.common.ports import bind_error
from recpipe.serving.server.batching import Predictor
from recpipe.serving.examples import SIGNATURES, classes, examples_from_input
from recpipe.serving.server.metrics import Metrics
from recpipe.serving.server.registry import EXAMPLES_SIGNATURE, SIGNATURE, ModelRegistry, RequestError
from recpipe.serving.server.signatures import (SignatureNotFound, output_aliases, predict_signature, run_signature,
                                               signature_outputs)

__all__ = ["make_grpc_server"]


def _version(spec) -> int | None:
    return spec.version.value if spec.HasField("version") else None


class _Prediction(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, registry: ModelRegistry, predictor: Predictor, metrics: Metrics):
        self.registry, self.predictor, self.metrics = registry, predictor, metrics

    def _lookup(self, spec, context, signatures=None):
        """The version `spec` asks for; aborts NOT_FOUND for another model or version, INVALID_ARGUMENT for a
        signature_name not in `signatures` (None: any; TF Serving's GetModelMetadata ignores it)."""
        if spec.name != self.registry.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({spec.name})")
        if signatures is not None and spec.signature_name not in signatures:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"signature {spec.signature_name!r} not found")
        try:
            return self.registry.get(_version(spec))
        except LookupError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e).strip("'\""))

    def Predict(self, request, context):
        t0 = time.perf_counter()
        failed = True
        try:
            lv = self._lookup(request.model_spec, context)
            try:  # as TF Serving: any signature of the model; one it lacks is FAILED_PRECONDITION
                signature = predict_signature(lv, request.model_spec.signature_name)
            except SignatureNotFound as e:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            try:
                aliases = output_aliases(signature_outputs(lv, signature), request.output_filter)
                cols = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                outputs = (self.predictor.predict(lv, cols) if signature == SIGNATURE
                           else run_signature(lv, signature, cols))
            except (RequestError, ValueError, TypeError, OverflowError, tf.errors.InvalidArgumentError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e).splitlines()[0])
            failed = False
        finally:
            status = context.code()  # what abort() set; None when the call succeeded
            code = status.name if status is not None else ("UNKNOWN" if failed else "OK")
            self.metrics.request("grpc_predict", code, time.perf_counter() - t0)
        resp = predict_pb2.PredictResponse()
        resp.model_spec.name = self.registry.name
        resp.model_spec.version.value = lv.version
        resp.model_spec.signature_name = signature
        for k in aliases:
            resp.outputs[k].CopyFrom(tf.make_tensor_proto(np.asarray(outputs[k])))
        return resp

    def _score_examples(self, api: str, request, context):
        """(version, scores) of a Classify/Regress request's tf.Examples."""
        t0 = time.perf_counter()
        failed = True
        try:
            lv = self._lookup(request.model_spec, context, SIGNATURES)
            try:
                scores = lv.score_examples(examples_from_input(request.input))
            except RequestError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e).splitlines()[0])
            failed = False
        finally:
            status = context.code()
            code = status.name if status is not None else ("UNKNOWN" if failed else "OK")
            self.metrics.request(api, code, time.perf_counter() - t0)
        return lv, scores

    def _spec(self, resp, lv) -> None:
        resp.model_spec.name = self.registry.name
        resp.model_spec.version.value = lv.version
        resp.model_spec.signature_name = EXAMPLES_SIGNATURE

    def Classify(self, request, context):
        lv, scores = self._score_examples("grpc_classify", request, context)
        resp = classification_pb2.ClassificationResponse()
        self._spec(resp, lv)
        for pairs in classes(scores):
            classification = resp.result.classifications.add()
            for label, score in pairs:
                classification.classes.add(label=label, score=score)
        return resp

    def Regress(self, request, context):
        lv, scores = self._score_examples("grpc_regress", request, context)
        resp = regression_pb2.RegressionResponse()
        self._spec(resp, lv)
        for p in scores:
            resp.result.regressions.add(value=float(p))
        return resp

    def GetModelMetadata(self, request, context):
        if not request.metadata_field:  # TF Serving's checks and messages (get_model_metadata_impl.cc)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != "signature_def":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"Metadata field {field} is not supported (only signature_def)")
        lv = self._lookup(request.model_spec, context)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for k, v in lv.signature_defs.items():
            sig_map.signature_def[k].CopyFrom(v)
        resp = get_model_metadata_pb2.GetModelMetadataResponse()
        resp.model_spec.name = self.registry.name
        resp.model_spec.version.value = lv.version
        resp.metadata["signature_def"].Pack(sig_map)
        return resp


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    def GetModelStatus(self, request, context):
        if request.model_spec.name != self.registry.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {request.model_spec.name}")
        try:
            versions = ([self.registry.get(_version(request.model_spec))] if _version(request.model_spec)
                        else self.registry.versions())
        except LookupError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e).strip("'\""))
        resp = get_model_status_pb2.GetModelStatusResponse()
        for lv in versions:
            st = resp.model_version_status.add()
            st.version = lv.version
            st.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        return resp


def make_grpc_server(registry: ModelRegistry, predictor: Predictor, metrics: Metrics, host: str, port: int,
                     workers: int = 8) -> tuple[grpc.Server, int]:
    """TF Serving's gRPC services over `registry`, bound (not started).

    Args:
        registry: the loaded versions to serve.
        predictor: what runs `serving_default` (validation, batching).
        metrics: where each call is counted.
        host: the address to bind.
        port: the port to bind; 0 picks a free one.
        workers: the threads answering calls.

    Returns:
        (the server, the bound port).

    Raises:
        OSError: the port is in use (or cannot be bound), in one line naming it. gRPC's default
            SO_REUSEPORT is off, so a second server on a port in use fails instead of sharing it.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", 16 * 1024 * 1024), ("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_Prediction(registry, predictor, metrics),
                                                                        server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(registry), server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio raises where older releases returned 0
        bound = 0
    if bound == 0:
        raise bind_error("gRPC", host, port)
    return server, bound
