"""TF Serving's gRPC API on the official tensorflow-serving-api protos.

PredictionService.Predict / Classify / Regress / GetModelMetadata and ModelService.GetModelStatus, so
a client built on `prediction_service_pb2_grpc.PredictionServiceStub` works unchanged (Classify and
Regress: recpipe.serving.examples).
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

from recpipe.serving.server.batching import Predictor
from recpipe.serving.examples import SIGNATURES, classes, examples_from_input
from recpipe.serving.server.metrics import Metrics
from recpipe.serving.server.registry import EXAMPLES_SIGNATURE, SIGNATURE, ModelRegistry, RequestError

__all__ = ["make_grpc_server"]


def _version(spec) -> int | None:
    return spec.version.value if spec.HasField("version") else None


class _Prediction(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, registry: ModelRegistry, predictor: Predictor, metrics: Metrics):
        self.registry, self.predictor, self.metrics = registry, predictor, metrics

    def _lookup(self, spec, context, signatures=("", SIGNATURE)):
        if spec.name != self.registry.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({spec.name})")
        if spec.signature_name not in signatures:
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
            try:
                cols = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                outputs = self.predictor.predict(lv, cols)
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
        resp.model_spec.signature_name = SIGNATURE
        for k, v in outputs.items():
            resp.outputs[k].CopyFrom(tf.make_tensor_proto(np.asarray(v)))
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
        lv = self._lookup(request.model_spec, context)
        if list(request.metadata_field) != ["signature_def"]:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "metadata_field must be ['signature_def']")
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
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_Prediction(registry, predictor, metrics),
                                                                        server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(registry), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind gRPC on {host}:{port}")
    return server, bound
