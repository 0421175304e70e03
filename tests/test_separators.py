"""A multivalent feature's `separator` on every path of the one transform: the Beam job's canonicalisation
(and its list_item_has_separator dead letter), the serving graph fed by request_from_arrow (the export's
skew check), the REST request parser (`recpipe serve`) and predict_examples' tf.Example parsing give the
same tokens and IDs for lists and joined strings, and refuse the same rows."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from recpipe.common.errors import ConfigError
from recpipe.features.artifact import TransformArtifact
from recpipe.features.batch_transform import BatchTransform
from recpipe.features.canonical import (LABEL_KEY, canonicalize, check_schema, list_separators, splits_back,
                                        validate_batch)
from recpipe.features.config import parse_config
from recpipe.features.transform import (FeatureTransform, canonicalize_request, example_spec, examples_from_arrow,
                                        request_from_arrow, request_from_examples, request_spec)
from recpipe.serving.server.registry import RequestError
from recpipe.serving.server.rest import parse_predict_body

COLUMN = "toks"
_TYPES = {"list": pa.list_(pa.string()), "ints": pa.list_(pa.int64()), "string": pa.string()}
# separators worth their own draw: the default, regex metacharacters, whitespace, several characters (some
# overlapping themselves), unicode, digits and '-' (which list<int> items hold)
SEPARATORS = ["|", ";", ",", ".", "+", "*", "?", "\\", "(", "[", "$", "^", " ", "\t", "\n", "||", "::", ", ",
              "aba", "aa", "é", "—", "🙂", "1", "-", "\\d"]


def _cfg(separator: str):
    return parse_config({"name": "t", "label": {"column": "y"}, "features": {"sparse": [
        {"name": "t", "column": COLUMN, "multivalent": True, "separator": separator,
         "vocab": {"min_count": 1, "oov_buckets": 3}}]}})


def _beam(table: pa.Table, separator: str):
    """The Beam job's pure functions: (refused rows, the kept rows' tokens, their IDs, the artifact)."""
    cfg = _cfg(separator)
    good, bad = validate_batch(table, cfg)
    assert set(bad.reasons) <= {"list_item_has_separator"} and set(bad.fields) <= {COLUMN}
    canon = canonicalize(table.filter(pa.array(good)), cfg)
    tokens = canon["t"].to_pylist()
    vocab = sorted({t for row in tokens for t in row})[::2]  # half the tokens in the vocabulary, half OOV
    art = TransformArtifact(config=cfg, raw_schema=check_schema(table.schema, cfg, "mem"),
                            vocabularies={"t": vocab}, vocab_counts={"t": [1] * len(vocab)}, dense_stats={})
    ids = BatchTransform(art)({k: v for k, v in canon.items() if k != LABEL_KEY})["t"]
    rows = np.split(ids.values, np.cumsum(ids.row_lengths)[:-1]) if len(tokens) else []
    return set(bad.indices.tolist()), tokens, [r.tolist() for r in rows], art


def _graph(art: TransformArtifact, request: dict) -> tuple[list, list]:
    """Raw request tensors through the serving graph's canonicalisation and transform: (tokens, IDs)."""
    canon = canonicalize_request({k: tf.constant(v) if not isinstance(v, tf.Tensor) else v
                                  for k, v in request.items()}, art)
    tokens = [[t.decode() for t in row] for row in canon["t"].to_list()]
    return tokens, FeatureTransform(art)(canon)["t"].to_list()


def _rows(draw, separator: str, encoding: str) -> list:
    """Rows for `encoding` whose items and strings are made of pieces of the separator and around it (the
    separator first: Hypothesis draws the first choice most)."""
    pieces = st.one_of(st.sampled_from([separator, "a", separator[:1], separator[1:], " ", "é", ""]),
                       st.text(max_size=2))
    text = st.lists(pieces, min_size=1, max_size=4).map("".join)
    if encoding == "ints":
        value = st.lists(st.one_of(st.integers(-30, 30), st.none()), max_size=4)
    elif encoding == "list":
        value = st.lists(st.one_of(text, st.none()), max_size=4)
    else:
        value = st.lists(text, max_size=4).map(separator.join) | text
    return draw(st.lists(st.one_of(value, st.none()), min_size=1, max_size=6))


@pytest.mark.unit
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_path_splits_and_refuses_rows_alike(data):
    """Random separators, lists (of strings or integers, null items too) and joined strings: the Beam job's
    canonicalisation, request_from_arrow (the export's skew check), the REST parser (a JSON list, and the
    same list joined by the feature's separator) and tf.Examples give the same tokens and IDs for every row
    the Beam job keeps, and each refuses, naming the input and row, exactly the rows it dead-letters."""
    encoding = data.draw(st.sampled_from(sorted(_TYPES)), "encoding")
    some = st.sampled_from(["-", "1", "12", "-1", ";"]) if encoding == "ints" else st.sampled_from(SEPARATORS)
    separator = data.draw(st.one_of(some, st.text(min_size=1, max_size=3)), "separator")
    rows = _rows(data.draw, separator, encoding)
    if encoding == "list":  # and a row the Beam job dead-letters, somewhere
        around = st.sampled_from(["", "a", separator[:1], separator[-1:]])
        item = data.draw(around) + separator + data.draw(around)
        rows.insert(data.draw(st.integers(0, len(rows))), data.draw(st.lists(st.just("b"), max_size=2)) + [item])
    table = pa.table({"y": pa.array([0] * len(rows)), COLUMN: pa.array(rows, _TYPES[encoding])})

    refused, tokens, ids, art = _beam(table, separator)
    event(f"{encoding}, {'one character' if len(separator) == 1 else 'several'}, rows refused: {bool(refused)}")
    assert refused == {i for i, r in enumerate(rows) if isinstance(r, list) and not splits_back(r, separator)}
    kept = pa.array([i for i in range(len(rows)) if i not in refused], pa.int64())
    specs = request_spec(art)
    separators = list_separators(art.config)
    assert separators == {COLUMN: separator}

    # the serving graph on the rows as the export's skew check builds them
    assert _graph(art, request_from_arrow(table.take(kept), specs, separators)) == (tokens, ids)
    # REST: a JSON list (or string) per row, and a list row joined by the feature's separator
    sent = [rows[i] for i in kept.to_pylist()]
    joined = [separator.join("" if x is None else str(x) for x in r) if isinstance(r, list) else r for r in sent]
    for values in (sent, joined) if sent else ():
        cols, _ = parse_predict_body({"instances": [{COLUMN: v} for v in values]}, specs, separators)
        assert _graph(art, cols) == (tokens, ids)
    # tf.Examples (predict_examples, classify, regress)
    examples = examples_from_arrow(table.take(kept), art.config, art.raw_schema)
    parsed = tf.io.parse_example(tf.constant(examples, tf.string), example_spec(art.config, art.raw_schema))
    assert _graph(art, request_from_examples(parsed, art)) == (tokens, ids)

    if refused:  # the whole batch: refused at the first row the Beam job dead-letters, named
        with pytest.raises(RequestError, match=f"input '{COLUMN}' row {min(refused)}: a list item contains the "):
            parse_predict_body({"instances": [{COLUMN: r} for r in rows]}, specs, separators)
        with pytest.raises(ValueError, match=f"column '{COLUMN}' row {min(refused)}: a list item contains the "):
            request_from_arrow(table, specs, separators)
    for i in sorted(refused):  # every path refuses each such row
        with pytest.raises(RequestError, match=f"input '{COLUMN}' row 0: a list item contains the separator"):
            parse_predict_body({"inputs": {COLUMN: [rows[i]]}}, specs, separators)
        one = tf.io.parse_example(tf.constant(examples_from_arrow(table.slice(i, 1), art.config, art.raw_schema)),
                                  example_spec(art.config, art.raw_schema))
        with pytest.raises(tf.errors.InvalidArgumentError, match="row 0: a list item contains the separator") as e:
            request_from_examples(one, art)
        assert f"input \\'{COLUMN}\\' row 0" in e.value.message or f"input '{COLUMN}' row 0" in e.value.message


# (separator, a log value, its tokens): the decisions every path makes alike
EDGE_CASES = [
    (";", "a;b", ["a", "b"]),
    (";", "a|b", ["a|b"]),                   # another feature's default is just a character
    (";", "", []),                           # an empty string: no token
    (";", "a;;b", ["a", "b"]),               # empty items: dropped
    (";", ";a;", ["a"]),                     # leading and trailing separators: empty items
    (";", " a ; b", [" a ", " b"]),          # whitespace is kept: tokens are not trimmed
    (", ", "a, b,c", ["a", "b,c"]),          # several characters: split on the whole separator
    ("aba", "xababay", ["x", "bay"]),        # overlapping matches: left to right, as str.split
    (".", "a.b", ["a", "b"]), ("+", "a+b", ["a", "b"]), ("\\", "a\\b", ["a", "b"]),  # literally, no pattern
    ("\\d", "a1b\\dc", ["a1b", "c"]),
    ("—", "é—日本", ["é", "日本"]),          # unicode
    (";", ["a", "", None, "b"], ["a", "b"]),  # a list's empty and null items: no tokens
    ("-", [7, -3], ["7"]),                   # a list<int> item holding the separator ('-3'): dead-lettered
    ("1", [7, 20], ["7", "20"]),
]


@pytest.mark.unit
def test_edge_cases_read_alike_as_a_list_and_a_joined_string():
    """Each case through the Beam job as its log column, and through the serving graph from a REST request
    of the same value and of its tokens joined by the separator; a list the separator cannot carry is
    dead-lettered and refused by the REST parser, and the rest of it reads alike."""
    for separator, row, tokens in EDGE_CASES:
        refused, beam, _, art = _beam(pa.table({"y": [0], COLUMN: pa.array([row])}), separator)
        if refused:
            with pytest.raises(RequestError, match="row 0: a list item contains the separator"):
                parse_predict_body({"inputs": {COLUMN: [row]}}, request_spec(art), list_separators(art.config))
            row = [x for x in row if separator not in str(x)]
            refused, beam, _, art = _beam(pa.table({"y": [0], COLUMN: pa.array([row])}), separator)
        assert not refused and beam == [tokens], (separator, row)
        specs, separators = request_spec(art), list_separators(art.config)
        for value in (row, separator.join(tokens)):
            cols, _ = parse_predict_body({"inputs": {COLUMN: [value]}}, specs, separators)
            assert _graph(art, cols)[0] == [tokens], (separator, value)


@pytest.mark.unit
def test_a_list_the_separator_cannot_carry_is_refused_with_the_features_separator():
    """A list item holding the feature's separator (';' here, not '|') is dead-lettered by the Beam job and
    refused by the REST parser naming input and row; '|' in an item is then an ordinary character. A
    separator of several characters also refuses items that overlap it so the joined list splits elsewhere."""
    rows = [["a|b", "c"], ["a;b"], ["x"]]
    refused, tokens, _, art = _beam(pa.table({"y": [0] * 3, COLUMN: pa.array(rows)}), ";")
    assert refused == {1} and tokens == [["a|b", "c"], ["x"]]
    specs, separators = request_spec(art), list_separators(art.config)
    with pytest.raises(RequestError, match=r"^input 'toks' row 1: a list item contains the separator ';'$"):
        parse_predict_body({"instances": [{COLUMN: r} for r in rows]}, specs, separators)
    cols, _ = parse_predict_body({"instances": [{COLUMN: ["a", "b"]}]}, specs, separators)
    assert cols[COLUMN].tolist() == [b"a;b"]  # not "a|b", one unknown token
    refused, tokens, _, _ = _beam(pa.table({"y": [0] * 2, COLUMN: pa.array([["xab", "ay"], ["xa", "y"]])}), "aba")
    assert refused == {0} and tokens == [["xa", "y"]] and not splits_back(["xab", "ay"], "aba")


@pytest.mark.unit
def test_config_refuses_separators_that_cannot_work():
    """An empty separator splits nothing (TF would split on whitespace, Arrow refuses it), and two
    multivalent features of one column with different separators cannot share its request input."""
    with pytest.raises(ConfigError, match=r"^features\.sparse\[0\]\.separator: expected a non-empty string"):
        _cfg("")
    two = {"name": "t", "label": {"column": "y"}, "features": {"sparse": [
        {"name": "a", "column": "c", "multivalent": True, "hash_buckets": 10},
        {"name": "b", "column": "c", "multivalent": True, "separator": ";", "hash_buckets": 10}]}}
    with pytest.raises(ConfigError, match=r"^features\.sparse\[1\]\.separator: ';', but features\.sparse\[0\] "
                                          r"reads column 'c' with '\|'"):
        parse_config(two)
    two["features"]["sparse"][0]["separator"] = ";"
    assert list_separators(parse_config(two)) == {"c": ";"}


@pytest.mark.system
def test_a_semicolon_separator_exports_and_serves_lists_and_joined_strings_alike(tmp_path, small_log):
    """preprocess -> train -> export of the small log with `separator: ';'` on its list column hist_items:
    the export's skew check passes (it joined the sample's lists with '|', which the graph split on ';':
    'the transform of hist differs'); the server scores a JSON list like the same items joined by ';' (it
    joined lists with '|': one unknown token, scored with 200), and refuses an item holding ';', naming
    input and row: REST predict and classify 400, gRPC Regress INVALID_ARGUMENT."""
    import glob
    import urllib.error
    import urllib.request

    import grpc
    import pyarrow.parquet as pq
    from tensorflow_serving.apis import prediction_service_pb2_grpc, regression_pb2

    from recpipe.pipeline.preprocess import run_preprocess
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.serving.server.serve import ModelServer, ServeOptions
    from recpipe.serving.version import ExportBase
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train

    from conftest import IN_MEMORY, small_config_dict
    from helpers import QUIET, config_file, write_table

    log = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]).slice(0, 1500)
    write_table(tmp_path / "log" / "part-0.parquet", log)
    cfg_dict = small_config_dict(steps=10)
    cfg_dict["features"]["sparse"][2]["separator"] = ";"
    cfg_path, cfg = config_file(tmp_path, cfg_dict), parse_config(cfg_dict)
    run_preprocess(cfg, str(tmp_path / "log"), str(tmp_path / "pre"), IN_MEMORY, **QUIET)
    train(TrainOptions(data_dir=str(tmp_path / "pre"), model_dir=str(tmp_path / "m"), config_path=cfg_path), **QUIET)
    base = str(tmp_path / "export")
    export_model(str(tmp_path / "m"), base, version=1)
    assert ExportBase(base).version(1).skew_report()["passed"]

    inputs = {f.column for f in cfg.column_sparse} | {d.column for d in cfg.features.dense}
    rows = [{k: v for k, v in r.items() if k in inputs and v is not None} for r in log.slice(0, 8).to_pylist()]
    srv = ModelServer(ServeOptions(base, "semi", rest_port=0, grpc_port=0, poll_seconds=5)).start()
    try:
        def predict(sent: list, verb: str = ":predict"):
            body = {"examples" if verb == ":classify" else "instances": sent}
            req = urllib.request.Request(f"http://127.0.0.1:{srv.rest_port}/v1/models/semi{verb}",
                                         data=json.dumps(body).encode(), method="POST")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        assert srv.registry.get().list_inputs == {"hist_items": ";"}
        assert any(len(r.get("hist_items") or []) > 1 for r in rows)
        code, as_lists = predict(rows)
        assert code == 200, as_lists
        code, as_strings = predict([{**r, "hist_items": ";".join(r["hist_items"])} if "hist_items" in r else r
                                    for r in rows])
        assert code == 200 and as_strings["predictions"] == as_lists["predictions"]
        code, piped = predict([{**r, "hist_items": "|".join(r["hist_items"])} if r.get("hist_items") else r
                               for r in rows])
        assert code == 200 and piped["predictions"] != as_lists["predictions"]  # '|' is no separator here
        code, body = predict([rows[0], {**rows[1], "hist_items": ["a;b", "c"]}])
        refusal = "a list item contains the separator ';'"
        assert code == 400 and body["error"] == "input 'hist_items' row 1: " + refusal
        dense = {d.column for d in cfg.features.dense}  # a tf.Example's float_list: JSON floats
        examples = [{k: float(v) if k in dense else v for k, v in r.items()} for r in rows[:2]]
        code, body = predict([examples[0], {**examples[1], "hist_items": ["a;b", "c"]}], ":classify")
        assert code == 400 and body["error"] == "examples: input 'hist_items' row 1: " + refusal
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:  # Classify/Regress: tf.Examples
            req = regression_pb2.RegressionRequest()
            req.model_spec.name = "semi"
            req.input.example_list.examples.add().features.feature["hist_items"].bytes_list.value.extend([b"a;b"])
            with pytest.raises(grpc.RpcError) as e:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Regress(req, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "examples: input 'hist_items' row 0: " + refusal
    finally:
        srv.stop()
