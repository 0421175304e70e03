"""TF Serving's SavedModel warmup: requests an export writes into
`<version>/assets.extra/tf_serving_warmup_requests` (a TFRecord file of tensorflow.serving.PredictionLog
protos), which TF Serving replays on a version before it serves it, and so does our server.

Why: the first call of a loaded version's signature runs its graph for the first time (kernel and
table set-up), about 0.4 s here against 2 ms for the next call; without warmup the first requests after
every push pay it, as a p99 spike, under TF Serving too (TFX's InfraValidator writes such a file for the
same reason). An export writes a Predict request of the first eval-sample rows on `serving_default` and,
for ranking, a Predict request of the same rows as serialized tf.Examples on `predict_examples`: every
signature a client can call, each through the one API TF Serving replays on any signature (TF Serving
refuses Classify and Regress on a signature not shaped for them, and a failed warmup request fails the
version's load).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from recpipe.features.canonical import list_separators
from recpipe.features.config import Config
from recpipe.features.transform import examples_from_arrow, int64_nulls, request_from_arrow
from recpipe.serving.examples import examples_from_input
from recpipe.serving.version import EXAMPLES_INPUT, EXAMPLES_SIGNATURE, SIGNATURE

__all__ = ["WARMUP_ROWS", "missing_rows", "warmup_logs", "write_warmup", "read_warmup", "replay"]

WARMUP_ROWS = 8  # rows per request: enough to run every branch of the graph, small on disk


def missing_rows(specs: dict[str, tf.TensorSpec], n: int) -> dict[str, np.ndarray]:
    """n rows of a signature's inputs with every value missing ("" and NaN; 0 for an integer input, which
    cannot say missing)."""
    out = {}
    for name, spec in specs.items():
        if spec.dtype == tf.string:
            out[name] = np.array([b""] * n, dtype=object)
        elif spec.dtype.is_integer:
            out[name] = np.zeros(n, spec.dtype.as_numpy_dtype)
        else:
            out[name] = np.full(n, np.nan, spec.dtype.as_numpy_dtype)
    return out


def warmup_logs(serve_fn, has_examples: bool, sample: pa.Table, cfg: Config,
                raw_schema: dict[str, str]) -> list[prediction_log_pb2.PredictionLog]:
    """The export's warmup requests, from its eval sample.

    Args:
        serve_fn: the export's serving_default function.
        has_examples: the export has the predict_examples signature (ranking).
        sample: raw eval-sample rows.
        cfg: the config the model was trained with.
        raw_schema: the raw columns' kinds, as the transform artifact records them.

    Returns:
        A Predict request on serving_default (rows an int64 input can carry) and, with has_examples, a
        Predict request on predict_examples of the same rows as serialized tf.Examples.
    """
    specs = dict(serve_fn.structured_input_signature[1])
    rows = sample.filter(pa.array(~int64_nulls(sample, specs))).slice(0, WARMUP_ROWS)
    request = request_from_arrow(rows, specs, list_separators(cfg)) if rows.num_rows else None
    columns = ({k: t.numpy() for k, t in request.items()} if request is not None
               else missing_rows(specs, 1))  # no sample row that an int64 input can carry
    logs = [_predict_log(SIGNATURE, columns)]
    if has_examples:
        examples = examples_from_arrow(sample.slice(0, WARMUP_ROWS), cfg, raw_schema)
        logs.append(_predict_log(EXAMPLES_SIGNATURE, {EXAMPLES_INPUT: np.array(examples, dtype=object)}))
    return logs


def _predict_log(signature: str, columns: dict[str, np.ndarray]) -> prediction_log_pb2.PredictionLog:
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature
    for name, column in columns.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(column))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def write_warmup(path: str, logs: list[prediction_log_pb2.PredictionLog]) -> None:
    tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())


def read_warmup(path: str) -> list[prediction_log_pb2.PredictionLog]:
    return [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]


def replay(lv, logs: list[prediction_log_pb2.PredictionLog], source: str) -> None:
    """Run each request of `source` on the loaded version `lv` (recpipe.serving.server.registry.LoadedVersion), as TF
    Serving does before a version serves: one that fails fails the load, naming its record.

    Raises:
        ValueError: a request fails, or is of a kind this server does not serve; the message names the record.
    """
    for i, log in enumerate(logs):
        kind = log.WhichOneof("log_type")
        try:
            if kind == "predict_log":
                request = log.predict_log.request
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                if request.model_spec.signature_name == EXAMPLES_SIGNATURE:
                    lv.score_examples(list(inputs.pop(EXAMPLES_INPUT).reshape(-1)))
                else:
                    lv.predict(inputs)
            elif kind in ("classify_log", "regress_log"):
                lv.score_examples(examples_from_input(getattr(log, kind).request.input))
            else:
                raise ValueError(f"a {kind}, which this server does not serve (predict, classify and regress)")
        except Exception as e:  # noqa: BLE001 - named with its record, whatever it is
            raise ValueError(f"{source}: warmup record {i} ({kind}) fails: {e}") from None
