"""Export layout and the model server's TF Serving REST + gRPC APIs, against the real SavedModel."""
import glob
import json
from pathlib import Path
import os
import shutil
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

from recpipe.serving.export.savedmodel import SkewError, export_model
from recpipe.serving.version import ExportBase
from recpipe.serving.server.registry import RequestError
from recpipe.serving.server.rest import format_predict_response, parse_predict_body
from recpipe.serving.server.serve import ModelServer, ServeOptions

from helpers import raw_rows


def _http(method, url, body=None):
    data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def server(exported):
    base, _ = exported
    srv = ModelServer(ServeOptions(base, "small", rest_port=0, grpc_port=0, poll_seconds=0.2)).start()
    yield srv
    srv.stop()


@pytest.mark.integration
def test_export_layout(exported, trained):
    base, path = exported
    assert os.path.basename(path) == "1" and [v.version for v in ExportBase(base).versions()] == [1]
    assert os.path.isfile(os.path.join(path, "saved_model.pb")) and os.path.isdir(os.path.join(path, "variables"))
    assert not [d for d in os.listdir(base) if d.startswith(".tmp")]
    meta = json.loads(Path(os.path.join(path, "assets.extra", "recpipe.json")).read_text())
    assert meta["version"] == 1 and meta["config"]["name"] == "small_ctr"
    with pytest.raises(FileExistsError):
        export_model(trained, base, version=1)


@pytest.mark.integration
def test_export_skew_check_report(exported, preprocessed):
    _, path = exported
    report = json.loads(Path(os.path.join(path, "skew_check.json")).read_text())
    assert report["passed"] and report["rows"] == min(1000, preprocessed[1].rows_eval)
    assert report["max_abs_diff"] <= report["tolerance"] == 1e-5


@pytest.mark.integration
def test_export_fails_on_skew_and_publishes_nothing(tmp_path, trained, monkeypatch):
    import recpipe.serving.export.savedmodel as export_mod
    real = export_mod.read_single_batch

    def skewed(cfg, path):  # the preprocessing computed I1 differently from the serving graph
        batch = dict(real(cfg, path))
        batch["I1"] = batch["I1"] + 1.0
        return batch

    monkeypatch.setattr(export_mod, "read_single_batch", skewed)
    base = str(tmp_path / "exp")
    with pytest.raises(export_mod.SkewError, match="skew check failed"):
        export_model(trained, base, version=7)
    assert os.listdir(base) == []  # neither version 7 nor its temp folder


@pytest.mark.integration
def test_a_skew_failure_names_the_feature(tmp_path, trained, monkeypatch):
    import recpipe.serving.export.savedmodel as export_mod
    real = export_mod.read_single_batch

    def skewed(cfg, path):
        batch = dict(real(cfg, path))
        batch["I2"] = batch["I2"] + 1.0
        return batch

    monkeypatch.setattr(export_mod, "read_single_batch", skewed)
    with pytest.raises(SkewError, match="the transform of I2 differs between serving and the Beam job"):
        export_model(trained, str(tmp_path / "exp"), version=3)


@pytest.mark.integration
def test_saved_model_scores_raw_rows_like_the_trainer(exported, trained, small_log, small_cfg):
    """Raw rows through the SavedModel == the same rows through Arrow canonicalisation + trainer model."""
    from recpipe.features.canonical import LABEL_KEY, canonicalize
    from recpipe.features.transform import FeatureTransform, canonical_to_tensors, request_from_arrow
    from recpipe.trainers.model_dir import load_trained
    _, path = exported
    fn = tf.saved_model.load(path).signatures["serving_default"]
    files = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))
    table = pq.read_table(files[-1]).slice(0, 64)
    cfg, art, model = load_trained(trained)
    request = request_from_arrow(table, dict(fn.structured_input_signature[1]))
    served = fn(**request)["score"].numpy()
    canon = canonicalize(table, cfg)
    feats = FeatureTransform(art)(canonical_to_tensors({k: v for k, v in canon.items() if k != LABEL_KEY}))
    direct = tf.sigmoid(model(feats))[:, 0].numpy()
    np.testing.assert_allclose(served, direct, atol=1e-5)
    # the server's packed call of the signature (one block per dtype, recpipe.serving.server.registry) scores exactly
    # like the public call
    from recpipe.serving.server.registry import load_version
    lv = load_version(path, 1)
    assert sorted(n for _, names in lv._groups for n in names) == sorted(request)
    np.testing.assert_array_equal(lv.run({k: v.numpy() for k, v in request.items()})["score"],
                                  lv.fn(**request)["score"].numpy())


@pytest.mark.integration
def test_rest_response_leaves_in_one_write(server, small_log, small_cfg, monkeypatch):
    """Header and body of a response are handed to the transport together (one write, so one send),
    for a prediction and for an error; the client still reads both whole."""
    from recpipe.serving.server.http_loop import _Connection
    writes = []
    real = _Connection.connection_made

    class Counted:  # the connection's transport, its writes recorded
        def __init__(self, transport):
            self._t = transport

        def write(self, data):
            writes.append(bytes(data))
            self._t.write(data)

        def __getattr__(self, name):
            return getattr(self._t, name)

    monkeypatch.setattr(_Connection, "connection_made", lambda self, t: real(self, Counted(t)))
    rows, _ = raw_rows(small_log, small_cfg, n=2)
    url = f"http://127.0.0.1:{server.rest_port}/v1/models/small:predict"
    for body, want in (({"instances": rows}, 200), ({"instances": []}, 400)):
        writes.clear()
        code, out = _http("POST", url, body)
        assert code == want
        assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 ")
        head, payload = writes[0].split(b"\r\n\r\n", 1)
        assert json.loads(payload) == out and f"Content-Length: {len(payload)}".encode() in head


@pytest.mark.integration
def test_rest_predict_row_and_columnar(server, exported, small_log, small_cfg):
    rows, _ = raw_rows(small_log, small_cfg)
    url = f"http://127.0.0.1:{server.rest_port}/v1/models/small"
    code, body = _http("POST", url + ":predict", {"instances": rows})
    assert code == 200 and len(body["predictions"]) == len(rows)
    assert all(0.0 < p < 1.0 for p in body["predictions"])
    lv = server.registry.get()
    cols, _ = parse_predict_body({"instances": rows}, lv.inputs)
    direct = lv.predict(cols)["score"]
    np.testing.assert_allclose(body["predictions"], direct, atol=1e-6)
    columnar = {k: [r.get(k) for r in rows] for k in lv.inputs}
    code, body2 = _http("POST", url + "/versions/1:predict", {"inputs": columnar})
    assert code == 200
    np.testing.assert_allclose(body2["outputs"], direct, atol=1e-6)


@pytest.mark.integration
def test_rest_status_metadata_health_and_errors(server):
    base = f"http://127.0.0.1:{server.rest_port}"
    code, body = _http("GET", base + "/v1/models/small")
    assert code == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    code, body = _http("GET", base + "/v1/models/small/metadata")
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert code == 200 and "user_id" in sig["inputs"] and "score" in sig["outputs"]
    assert _http("GET", base + "/healthz")[0] == 200
    assert _http("GET", base + "/v1/models/other")[0] == 404
    assert _http("POST", base + "/v1/models/small/versions/99:predict", {"instances": [{}]})[0] == 404
    for bad in [b"{not json", {"instances": []}, {"instances": [{"user_id": 5}]}, {"inputs": {"nope": [1]}},
                {"instances": [{"I1": "high"}]}, [1, 2], {"instances": [1], "inputs": {}}]:
        code, body = _http("POST", base + "/v1/models/small:predict", bad)
        assert code == 400 and body["error"], bad
    assert _http("GET", base + "/v1/models/small")[0] == 200  # still serving


@pytest.mark.unit
def test_parse_and_format_helpers():
    specs = {"a": tf.TensorSpec([None], tf.string), "x": tf.TensorSpec([None], tf.float32)}
    cols, row = parse_predict_body({"instances": [{"a": "u", "x": 1}, {"a": None}]}, specs)
    assert row and cols["a"].tolist() == [b"u", b""] and np.isnan(cols["x"][1])
    with pytest.raises(RequestError, match="signature 'other' not found"):
        parse_predict_body({"signature_name": "other", "instances": [{}]}, specs)
    assert format_predict_response({"score": np.array([0.5])}, True) == {"predictions": [0.5]}
    assert format_predict_response({"s": np.array([1.0]), "t": np.array([2.0])}, False) == {
        "outputs": {"s": [1.0], "t": [2.0]}}


@pytest.mark.integration
def test_grpc_with_official_stub(server, small_log, small_cfg):
    rows, _ = raw_rows(small_log, small_cfg, 4)
    lv = server.registry.get()
    cols, _ = parse_predict_body({"instances": rows}, lv.inputs)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        req = predict_pb2.PredictRequest()
        req.model_spec.name = "small"
        for k, v in cols.items():
            req.inputs[k].CopyFrom(tf.make_tensor_proto(v, dtype=lv.inputs[k].dtype))
        resp = stub.Predict(req, timeout=30)
        np.testing.assert_allclose(tf.make_ndarray(resp.outputs["score"]), lv.predict(cols)["score"], atol=1e-6)
        assert resp.model_spec.version.value == 1
        meta_req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        meta_req.model_spec.name = "small"
        meta = stub.GetModelMetadata(meta_req, timeout=30)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        meta.metadata["signature_def"].Unpack(sig_map)
        assert "serving_default" in sig_map.signature_def
        status_req = get_model_status_pb2.GetModelStatusRequest()
        status_req.model_spec.name = "small"
        status = model_service_pb2_grpc.ModelServiceStub(ch).GetModelStatus(status_req, timeout=30)
        assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        bad = predict_pb2.PredictRequest()
        bad.model_spec.name = "small"
        with pytest.raises(grpc.RpcError) as e:
            stub.Predict(bad, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _json_examples(table, artifact):
    """Raw rows as TF Serving's JSON examples in example_spec's layout: dense values as floats."""
    from recpipe.features.transform import example_spec
    spec = example_spec(artifact.config, artifact.raw_schema)
    rows = []
    for r in table.select(list(spec)).to_pylist():
        rows.append({k: (float(v) if spec[k].dtype == tf.float32 else v) for k, v in r.items() if v is not None})
    return rows


@pytest.mark.integration
def test_classify_and_regress_on_tf_examples(server, preprocessed, small_log):
    """tf.Examples of raw columns score like the same rows as columns: gRPC Classify/Regress with the
    official stub (example_list and example_list_with_context) and REST :classify/:regress."""
    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from recpipe.features.preprocessed import PreprocessedData
    from recpipe.features.transform import examples_from_arrow, request_from_arrow
    artifact = PreprocessedData(preprocessed[0]).transform()
    table = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[-1]).slice(0, 6)
    lv = server.registry.get()
    expected = lv.run({k: v.numpy() for k, v in request_from_arrow(table, lv.inputs).items()})["score"]
    examples = [example_pb2.Example.FromString(b)
                for b in examples_from_arrow(table, artifact.config, artifact.raw_schema)]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        req = classification_pb2.ClassificationRequest()
        req.model_spec.name = "small"
        req.input.example_list.examples.extend(examples)
        resp = stub.Classify(req, timeout=30)
        assert [[c.label for c in x.classes] for x in resp.result.classifications] == [["0", "1"]] * 6
        np.testing.assert_allclose([x.classes[1].score for x in resp.result.classifications], expected, atol=1e-6)
        np.testing.assert_allclose([x.classes[0].score for x in resp.result.classifications], 1 - expected,
                                   atol=1e-6)
        assert resp.model_spec.signature_name == "predict_examples" and resp.model_spec.version.value == 1
        reg = regression_pb2.RegressionRequest()
        reg.model_spec.name = "small"
        context = example_pb2.Example()  # C1 of the first row as context: rows without their own C1 take it
        context.features.feature["C1"].CopyFrom(examples[0].features.feature["C1"])
        for ex in examples:
            own = example_pb2.Example()
            own.CopyFrom(ex)
            if ex.features.feature["C1"] == context.features.feature["C1"]:
                del own.features.feature["C1"]
            reg.input.example_list_with_context.examples.append(own)
        reg.input.example_list_with_context.context.CopyFrom(context)
        values = [r.value for r in stub.Regress(reg, timeout=30).result.regressions]
        np.testing.assert_allclose(values, expected, atol=1e-6)
        two = example_pb2.Example()
        two.CopyFrom(examples[0])
        two.features.feature["C1"].bytes_list.value.append(b"extra")
        bad = classification_pb2.ClassificationRequest()
        bad.model_spec.name = "small"
        bad.input.example_list.examples.append(two)
        with pytest.raises(grpc.RpcError) as e:
            stub.Classify(bad, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'C1'" in e.value.details()
    url = f"http://127.0.0.1:{server.rest_port}/v1/models/small"
    rows = _json_examples(table, artifact)
    code, body = _http("POST", url + ":classify", {"examples": rows})
    assert code == 200 and [[c[0] for c in r] for r in body["result"]] == [["0", "1"]] * 6
    np.testing.assert_allclose([r[1][1] for r in body["result"]], expected, atol=1e-6)
    without_i2 = [{k: v for k, v in r.items() if k != "I2"} for r in rows]
    code, body = _http("POST", url + "/versions/1:regress", {"examples": without_i2, "context": {"I2": 1.5}})
    assert code == 200 and len(body["result"]) == 6
    code, body = _http("POST", url + ":regress", {"examples": rows[:1], "context": {}})
    np.testing.assert_allclose(body["result"], expected[:1], atol=1e-6)
    for bad_body, message in (({"examples": [{"I1": 3}]}, "I1"), ({"examples": []}, "non-empty"),
                              ({"examples": [{"C1": ["a", "b"]}]}, "'C1'"), ({"instances": [{}]}, "unknown key")):
        code, body = _http("POST", url + ":classify", bad_body)
        assert code == 400 and message in body["error"], (bad_body, body)


def _trained_on(tmp_path, log):
    """`log` written as TMP/log, preprocessed into TMP/pre with user_id read through a vocabulary, and a
    small model trained on it in TMP/m (20 steps)."""
    from recpipe.features.config import parse_config
    from recpipe.features.preprocessed import PreprocessedData
    from recpipe.pipeline.preprocess import run_preprocess
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train

    from conftest import IN_MEMORY, small_config_dict
    os.makedirs(tmp_path / "log")
    pq.write_table(log, str(tmp_path / "log" / "part-0.parquet"))
    cfg_dict = small_config_dict(steps=20)
    cfg_dict["features"]["sparse"][0] = {"name": "user_id", "column": "user_id", "vocab": {"min_count": 1},
                                         "embedding_dim": 8}
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg_dict))
    run_preprocess(parse_config(cfg_dict), str(tmp_path / "log"), str(tmp_path / "pre"), IN_MEMORY,
                   say=lambda _: None)
    train(TrainOptions(data_dir=str(tmp_path / "pre"), model_dir=str(tmp_path / "m"),
                       config_path=str(tmp_path / "cfg.yaml")), say=lambda _: None)
    return PreprocessedData(str(tmp_path / "pre"))


@pytest.mark.system
def test_integer_ids_null_list_items_and_string_numbers_export_and_serve(tmp_path, small_log):
    """A log whose ID column is integers, some of them null (the Beam job reads a null ID as ""), whose
    list column has null items (the Beam job drops them) and whose dense column is numbers in strings,
    some blank (missing, to the Beam job), exports and serves: predict_examples (a tf.Example leaves the
    ID out) scores every eval sample row like the trainer, serving_default (int64 input) the rows it
    can carry, and the export's served AUC takes every row. Each of these used to fail every export:
    predict_examples handed the int64 input strings (TypeError), the skew check could not put a null
    into an int64 tensor, made a null list item the token 'None' ('the transform of hist differs
    between serving and the Beam job') and could not parse a blank dense string as a float."""
    import pyarrow as pa

    from recpipe.features.transform import examples_from_arrow, int64_nulls, request_from_arrow
    from recpipe.serving.export.savedmodel import sample_auc

    log = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]).slice(0, 2000)
    users = [None if i % 9 == 4 else i % 97 for i in range(log.num_rows)]
    log = log.set_column(log.schema.get_field_index("user_id"), "user_id", pa.array(users, pa.int64()))
    hist = [h[:1] + [None] + h[1:] if h and i % 3 == 0 else h
            for i, h in enumerate(log.column("hist_items").to_pylist())]
    log = log.set_column(log.schema.get_field_index("hist_items"), "hist_items", pa.array(hist, pa.list_(pa.string())))
    i1 = ["" if i % 5 == 2 else None if v is None else f" {v} " for i, v in enumerate(log.column("I1").to_pylist())]
    log = log.set_column(log.schema.get_field_index("I1"), "I1", pa.array(i1, pa.string()))
    data = _trained_on(tmp_path, log)
    assert data.transform().raw_schema["user_id"] == "int"
    path = export_model(str(tmp_path / "m"), str(tmp_path / "export"), version=1)
    version = ExportBase(str(tmp_path / "export")).version(1)
    report = version.skew_report()
    sample = pq.read_table(data.eval_sample_parquet)
    assert any(None in (h or []) for h in sample.column("hist_items").to_pylist())
    assert "" in sample.column("I1").to_pylist() and data.transform().raw_schema["I1"] == "string"
    nulls = int(sample.column("user_id").null_count)
    assert nulls > 0 and report["rows_left_out"] == nulls and report["rows"] == sample.num_rows - nulls
    assert report["passed"] and report["examples_passed"] and report["examples_rows"] == sample.num_rows

    loaded = tf.saved_model.load(path)
    serve, examples_fn = loaded.signatures["serving_default"], loaded.signatures["predict_examples"]
    specs = dict(serve.structured_input_signature[1])
    assert specs["user_id"].dtype == tf.int64
    meta = version.meta()
    via_examples = examples_fn(examples=tf.constant(examples_from_arrow(sample, meta.typed_config(),
                                                                        meta.raw_schema)))["score"].numpy()
    carried = ~int64_nulls(sample, specs)
    via_columns = serve(**request_from_arrow(sample.filter(pa.array(carried)), specs))["score"].numpy()
    np.testing.assert_allclose(via_examples[carried], via_columns, atol=1e-6)
    with pytest.raises(ValueError, match=r"column 'user_id' row \d+: null, which the int64 input"):
        request_from_arrow(sample, specs)
    assert 0.0 < sample_auc(version, sample) < 1.0


@pytest.mark.integration
def test_new_version_is_picked_up_and_corrupt_one_refused(tmp_path, exported, trained):
    """On a base of its own (a copy of the exported version 1): a corrupt version 3 is refused while 1 serves,
    and a new version 4 is then picked up and reported."""
    base = str(tmp_path / "base")
    shutil.copytree(exported[1], os.path.join(base, "1"))
    server = ModelServer(ServeOptions(base, "small", rest_port=0, grpc_port=None, poll_seconds=0.2)).start()
    try:
        os.makedirs(os.path.join(base, "3"))
        open(os.path.join(base, "3", "saved_model.pb"), "wb").write(b"garbage")
        time.sleep(1.0)
        assert server.registry.get().version == 1  # corrupt version 3 refused, 1 still serves
        shutil.rmtree(os.path.join(base, "3"))
        export_model(trained, base, version=4)
        deadline = time.monotonic() + 60
        while server.registry.get().version != 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server.registry.get().version == 4
        code, body = _http("GET", f"http://127.0.0.1:{server.rest_port}/v1/models/small")
        assert body["model_version_status"][0]["version"] == "4"
    finally:
        server.stop()


@pytest.mark.system
def test_retrieval_export_and_serving(tmp_path, preprocessed, small_log, small_cfg):
    import yaml

    from conftest import small_config_dict
    from recpipe.trainers.options import RunOptions, TrainOptions
    from recpipe.trainers.train import train
    d = small_config_dict()
    d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["user_id", "hist", "I1"],
                  "candidate_features": ["item_id"], "tower_layers": [16]}
    cfg_path = tmp_path / "tt.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    model_dir = str(tmp_path / "tt")
    train(TrainOptions(preprocessed[0], model_dir, str(cfg_path), run=RunOptions(steps=60)), say=lambda _: None)
    path = export_model(model_dir, str(tmp_path / "exp"), version=1, top_k=5)
    report = json.loads(Path(os.path.join(path, "skew_check.json")).read_text())
    assert report["passed"] and report["compared"] == "query_embedding"
    # int8 tables packed per width (recpipe.serving.export.quantize), the multivalent `hist` in item_id's table: exact too
    int8 = export_model(model_dir, str(tmp_path / "exp8"), version=1, top_k=5, embedding_dtype="int8",
                        dense_dtype="int8")
    assert json.loads(Path(os.path.join(int8, "skew_check.json")).read_text())["passed"]
    loaded = tf.saved_model.load(path)
    assert set(loaded.signatures) == {"serving_default", "query_embedding"}
    assert set(loaded.signatures["serving_default"].structured_input_signature[1]) == {"user_id", "hist_items", "I1"}
    srv = ModelServer(ServeOptions(str(tmp_path / "exp"), "tt", rest_port=0, grpc_port=None)).start()
    try:
        rows, _ = raw_rows(small_log, small_cfg, 3)
        query_rows = [{k: r[k] for k in ("user_id", "hist_items", "I1") if k in r} for r in rows]
        code, body = _http("POST", f"http://127.0.0.1:{srv.rest_port}/v1/models/tt:predict", {"instances": query_rows})
    finally:
        srv.stop()
    assert code == 200 and len(body["predictions"]) == 3
    first = body["predictions"][0]
    vocab_json = Path(os.path.join(preprocessed[0], "transform", "vocab", "item_id.json")).read_text()
    vocab = set(json.loads(vocab_json)["values"])
    assert len(first["candidates"]) == 5 and set(first["candidates"]) <= vocab
    assert first["scores"] == sorted(first["scores"], reverse=True)


@pytest.mark.system
def test_uint64_ids_of_2_to_the_63_and_more_serve_like_the_trainer(tmp_path, small_log):
    """A uint64 ID column (64-bit hashed user IDs: half of them 2**63 and more) trained, as decimal strings,
    but no int64 input could carry its upper half: the REST server answered 400 for those users. Now such a
    column is its own kind: serving_default takes it as uint64 (TF Serving's DT_UINT64), a tf.Example as its
    int64 bit pattern, and both score every eval sample row as the trainer does (the export's skew checks)."""
    import pyarrow as pa
    from tensorflow.core.example import example_pb2

    from recpipe.features.transform import examples_from_arrow, int64_nulls, request_from_arrow

    log = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]).slice(0, 2000)
    users = [None if i % 11 == 4 else (1 << 64) - 1 - i % 53 if i % 2 else i % 47 for i in range(log.num_rows)]
    log = log.set_column(log.schema.get_field_index("user_id"), "user_id", pa.array(users, pa.uint64()))
    data = _trained_on(tmp_path, log)
    art = data.transform()
    assert art.raw_schema["user_id"] == "uint64" and str((1 << 64) - 1) in art.vocabularies["user_id"]
    base = str(tmp_path / "export")
    export_model(str(tmp_path / "m"), base, version=1)
    report = ExportBase(base).version(1).skew_report()
    sample = pq.read_table(data.eval_sample_parquet)
    big = [u for u in sample.column("user_id").to_pylist() if u is not None and u >= 1 << 63]
    assert big and report["passed"] and report["examples_passed"] and report["examples_rows"] == sample.num_rows

    srv = ModelServer(ServeOptions(base, "u", rest_port=0, grpc_port=0, poll_seconds=0.2)).start()
    try:
        lv = srv.registry.get()
        assert lv.inputs["user_id"].dtype == tf.uint64
        rows = sample.filter(pa.array(~int64_nulls(sample, lv.inputs)))
        expected = lv.run({k: v.numpy() for k, v in request_from_arrow(rows, lv.inputs).items()})["score"]
        instances = [{k: v for k, v in r.items() if k in lv.inputs} for r in rows.to_pylist()]
        url = f"http://127.0.0.1:{srv.rest_port}/v1/models/u"
        code, body = _http("POST", url + ":predict", {"instances": instances})
        assert code == 200, body
        np.testing.assert_allclose([p["score"] if isinstance(p, dict) else p for p in body["predictions"]],
                                   expected, atol=1e-6)
        as_examples = [example_pb2.Example.FromString(b) for b in examples_from_arrow(rows, art.config, art.raw_schema)]
        high = next(i for i, u in enumerate(rows.column("user_id").to_pylist()) if u >= 1 << 63)
        assert as_examples[high].features.feature["user_id"].int64_list.value[0] < 0  # the bit pattern
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
            from tensorflow_serving.apis import regression_pb2
            stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            req = regression_pb2.RegressionRequest()
            req.model_spec.name = "u"
            req.input.example_list.examples.extend(as_examples)
            np.testing.assert_allclose([r.value for r in stub.Regress(req, timeout=30).result.regressions],
                                       expected, atol=1e-6)
            req = predict_pb2.PredictRequest()
            req.model_spec.name = "u"
            for k, v in request_from_arrow(rows, lv.inputs).items():
                req.inputs[k].CopyFrom(tf.make_tensor_proto(v.numpy()))
            got = tf.make_ndarray(stub.Predict(req, timeout=30).outputs["score"])
            np.testing.assert_allclose(got, expected, atol=1e-6)
            req.inputs["user_id"].CopyFrom(tf.make_tensor_proto(np.full(rows.num_rows, -1, np.int64)))
            with pytest.raises(grpc.RpcError) as e:  # a cast would wrap -1 around to 2**64 - 1, silently
                stub.Predict(req, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "out of uint64 range" in e.value.details()
        code, body = _http("POST", url + ":predict", {"instances": [{**instances[0], "user_id": -1}]})
        assert code == 400 and "integer out of uint64 range" in body["error"]
    finally:
        srv.stop()


def _predict_request(model: str, signature: str = "", output_filter=(), **inputs) -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    req.model_spec.signature_name = signature
    req.output_filter.extend(output_filter)
    for k, v in inputs.items():
        req.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    return req


def _rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=30)
    return e.value


@pytest.mark.integration
def test_predict_output_filter_as_tf_serving(tmp_path):
    """gRPC Predict's output_filter, by TF Serving's rules (predict_util.cc, PreProcessPrediction): only the
    named outputs; every one when it names none; an alias the signature lacks, or one named twice, is
    INVALID_ARGUMENT naming it. The server answered OK with every output whatever the filter named. A
    SavedModel of two outputs made here, served as any SavedModel is (no recpipe metadata)."""
    module = tf.Module()
    module.w = tf.Variable(2.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(x):
        return {"score": tf.sigmoid(module.w * x), "logit": module.w * x}
    tf.saved_model.save(module, str(tmp_path / "base" / "1"),
                        signatures={"serving_default": serve.get_concrete_function()})
    srv = ModelServer(ServeOptions(str(tmp_path / "base"), "two", rest_port=0, grpc_port=0)).start()
    try:
        x = np.array([0.5, -1.0], np.float32)
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as ch:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
            resp = stub.Predict(_predict_request("two", output_filter=["logit"], x=x), timeout=30)
            assert set(resp.outputs) == {"logit"} and resp.model_spec.signature_name == "serving_default"
            np.testing.assert_allclose(tf.make_ndarray(resp.outputs["logit"]), 2 * x)
            resp = stub.Predict(_predict_request("two", output_filter=["score"], x=x), timeout=30)
            assert set(resp.outputs) == {"score"}
            assert set(stub.Predict(_predict_request("two", x=x), timeout=30).outputs) == {"logit", "score"}
            e = _rpc_error(stub.Predict, _predict_request("two", output_filter=["score", "nope"], x=x))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
            assert "output tensor alias not found in signature: 'nope'" in e.details()
            assert "{logit,score}" in e.details()
            e = _rpc_error(stub.Predict, _predict_request("two", output_filter=["logit", "logit"], x=x))
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "duplicate output tensor alias: 'logit'" in e.details()
    finally:
        srv.stop()


@pytest.mark.integration
def test_unknown_signature_names_get_tf_serving_codes(server, small_log, small_cfg):
    """A signature the model lacks: gRPC Predict FAILED_PRECONDITION (predict_util.cc RunPredict), Classify
    and Regress INVALID_ARGUMENT (classifier.cc/regressor.cc), REST 400 with {"error": ...} (http_server.cc
    maps both codes to 400); GetModelMetadata ignores signature_name (get_model_metadata_impl.cc) and lists
    every signature. The server answered INVALID_ARGUMENT to Predict and refused GetModelMetadata."""
    from tensorflow_serving.apis import classification_pb2, regression_pb2
    rows, _ = raw_rows(small_log, small_cfg, 2)
    lv = server.registry.get()
    cols, _ = parse_predict_body({"instances": rows}, lv.inputs)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        e = _rpc_error(stub.Predict, _predict_request("small", "nope", **cols))
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "'nope' not found" in e.details(), e.details()
        for request, call in ((classification_pb2.ClassificationRequest(), stub.Classify),
                              (regression_pb2.RegressionRequest(), stub.Regress)):
            request.model_spec.name, request.model_spec.signature_name = "small", "nope"
            request.input.example_list.examples.add()
            e = _rpc_error(call, request)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope' not found" in e.details()
        meta_req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        meta_req.model_spec.name, meta_req.model_spec.signature_name = "small", "nope"
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        stub.GetModelMetadata(meta_req, timeout=30).metadata["signature_def"].Unpack(sig_map)
        assert {"serving_default", "predict_examples"} <= set(sig_map.signature_def)
        e = _rpc_error(stub.GetModelMetadata, get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=meta_req.model_spec))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "at least one metadata_field" in e.details()
    url = f"http://127.0.0.1:{server.rest_port}/v1/models/small"
    for verb, body in ((":predict", {"signature_name": "nope", "instances": rows}),
                       (":classify", {"signature_name": "nope", "examples": [{}]}),
                       (":predict", {"signature_name": 5, "instances": rows})):
        code, answer = _http("POST", url + verb, body)
        assert code == 400 and set(answer) == {"error"}, (verb, answer)
        assert ("'nope' not found" if body["signature_name"] == "nope" else "must be a string") in answer["error"]


@pytest.mark.integration
def test_predict_on_predict_examples_scores_like_classify(server, preprocessed, small_log):
    """TF Serving runs Predict on any signature, so a client sends serialized tf.Examples to predict_examples
    through Predict (input `examples`; over REST as {"b64": ...}): it scores them as Classify and
    serving_default do the same rows. The server refused any signature but serving_default."""
    import base64

    from tensorflow.core.example import example_pb2
    from tensorflow_serving.apis import classification_pb2

    from recpipe.features.preprocessed import PreprocessedData
    from recpipe.features.transform import examples_from_arrow, request_from_arrow
    artifact = PreprocessedData(preprocessed[0]).transform()
    table = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[-1]).slice(0, 6)
    lv = server.registry.get()
    expected = lv.run({k: v.numpy() for k, v in request_from_arrow(table, lv.inputs).items()})["score"]
    serialized = examples_from_arrow(table, artifact.config, artifact.raw_schema)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        resp = stub.Predict(_predict_request("small", "predict_examples", ["score"],
                                             examples=np.array(serialized, dtype=object)), timeout=30)
        assert resp.model_spec.signature_name == "predict_examples" and set(resp.outputs) == {"score"}
        np.testing.assert_allclose(tf.make_ndarray(resp.outputs["score"]), expected, atol=1e-6)
        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name = "small"
        classify.input.example_list.examples.extend(example_pb2.Example.FromString(s) for s in serialized)
        via_classify = [c.classes[1].score for c in stub.Classify(classify, timeout=30).result.classifications]
        np.testing.assert_allclose(tf.make_ndarray(resp.outputs["score"]), via_classify, atol=1e-6)
        e = _rpc_error(stub.Predict, _predict_request("small", "predict_examples", examples=np.array([1.0, 2.0])))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "'examples'" in e.details()
        e = _rpc_error(stub.Predict, _predict_request("small", "predict_examples", ["nope"],
                                                      examples=np.array(serialized, dtype=object)))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope'" in e.details()
    url = f"http://127.0.0.1:{server.rest_port}/v1/models/small:predict"
    b64 = [{"b64": base64.b64encode(s).decode()} for s in serialized]
    for body, key in (({"signature_name": "predict_examples", "instances": b64}, "predictions"),
                      ({"signature_name": "predict_examples", "instances": [{"examples": x} for x in b64]},
                       "predictions"),
                      ({"signature_name": "predict_examples", "inputs": {"examples": b64}}, "outputs")):
        code, answer = _http("POST", url, body)
        assert code == 200, answer
        np.testing.assert_allclose(answer[key], expected, atol=1e-6)
