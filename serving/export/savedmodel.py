"""Export a trained model as a SavedModel whose `serving_default` takes RAW log columns.

Ranking: `serving_default` returns `score`, and `predict_examples` the same `score` for serialized
tf.Examples of the same raw columns (recpipe.features.transform.example_spec; what TF Serving's classify and
regress clients send), checked equal on the eval sample at export. Retrieval: `query_embedding`
returns the query tower's output and `serving_default` the top-K `candidates` (labels) and `scores`
by brute force over a candidate index stored in the model (every vocabulary value of a single
vocabulary candidate feature, else every candidate seen in the data, one per ID of the first one). An
item-to-item model takes one input, the query's history feature or else the user's key: `query_scores` returns
its score of every candidate ID, and `serving_default` the top-K of the index's IDs.

EXPORT_BASE/<version>/ is TF Serving's versioned layout (recpipe.serving.version). The feature transform
(vocabulary tables, hashing, dense normalisation) is the same recpipe.features.transform.FeatureTransform the
Beam job ran, embedded in the graph; the SavedModel holds the model's variables, not its Keras
layers. The embedding tables and Dense kernels may be stored as bfloat16 or int8 (recpipe.serving.export.quantize),
and vocabulary values not seen in the last D days pruned from the tables (recpipe.serving.export.prune).
A version is written to a hidden temp folder, loaded, called, and skew-checked: up to 1000 eval rows
kept by the Beam job are scored through the exported signature from their raw columns and through the trained
model from their preprocessed record, and the export fails if any score differs by more than 1e-5
(`<version>/skew_check.json` records it). Only then is the folder renamed into place.
"""
from __future__ import annotations

import math
import os
import shutil
import uuid
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tensorflow as tf

from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import canonicalize, list_separators
from recpipe.features.config import config_to_dict
from recpipe.common.errors import RecpipeError
from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.records import read_single_batch
from recpipe.features.transform import (FeatureTransform, canonicalize_request, example_spec, examples_from_arrow,
                                int64_nulls, request_from_arrow, request_from_examples, request_spec, string_ids,
                                INTEGER_ID_DTYPES)
from recpipe.common.metrics import roc_auc
from recpipe.serving.export.prune import Pruning, prune_model, prune_vocabularies, pruned_candidates, pruned_records
from recpipe.serving.export.quantize import quantize_model
from recpipe.serving.server.registry import load_version
from recpipe.serving.warmup import missing_rows, warmup_logs, write_warmup
from recpipe.serving.version import EXAMPLES_INPUT, EXAMPLES_SIGNATURE, TEMP_PREFIX, ExportBase, ExportedVersion, ExportMeta
from recpipe.trainers.evaluation.candidates import read_clicks
from recpipe.trainers.model_dir import ModelDir, check_same_transform

__all__ = ["export_model", "skew_check", "examples_check", "differing_features", "SkewError",
           "ExportError", "SKEW_TOLERANCE", "sample_auc"]

SKEW_TOLERANCE = 1e-5


def _ranking_module(artifact: TransformArtifact, model: tf.keras.Model) -> tuple[tf.Module, dict]:
    module = tf.Module()
    module.transform = FeatureTransform(artifact)
    # The model's variables only, not the Keras model: its per-layer call functions would be saved too.
    module.weights = list(model.variables)

    specs = request_spec(artifact)

    # Every export signature, here and in _retrieval_module, is traced without AutoGraph: the transform, the
    # request canonicalisation and the models' forward passes branch and loop over Python values only (the
    # config, the feature list), so AutoGraph's conversion was pure tracing cost: 1.8 s of an export's 8.9 s
    # of CPU.
    # One graph of the transform and the model (saved once), over the request with integer ID columns as
    # the strings canonicalize_request makes of them anyway: both signatures call it, and a tf.Example
    # may leave an integer ID out ("", as a null in the log), which an int64 (uint64) input cannot say.
    @tf.function(input_signature=[string_ids(specs)], autograph=False)
    def score(inputs):
        features = module.transform(canonicalize_request(inputs, artifact))
        return {"score": tf.sigmoid(model(features))[:, 0]}

    score_fn = serve_fn = score.get_concrete_function()
    if string_ids(specs) != specs:  # integer ID inputs: serving_default takes them as int64, as logged

        @tf.function(input_signature=[specs], autograph=False)
        def serve(inputs):
            return score_fn({k: tf.strings.as_string(v) if v.dtype in INTEGER_ID_DTYPES else v
                             for k, v in inputs.items()})

        serve_fn = serve.get_concrete_function()
    spec = example_spec(artifact.config, artifact.raw_schema)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)], autograph=False)
    def predict_examples(examples):
        return score_fn(request_from_examples(tf.io.parse_example(examples, spec), artifact))

    return module, {"serving_default": serve_fn, EXAMPLES_SIGNATURE: predict_examples.get_concrete_function()}


def index_is_vocabulary(cfg) -> bool:
    """Whether a retrieval export's candidate index is a vocabulary (one candidate feature, with a vocab)
    rather than the candidates read from the data."""
    names = list(cfg.model.candidate_features)
    return len(names) == 1 and cfg.table_owner(cfg.sparse_by_name[names[0]]).vocab is not None


def _candidate_index(cfg, artifact: TransformArtifact, model: tf.keras.Model, data_dir: str,
                     pruning: Optional[Pruning] = None) -> tuple[np.ndarray, list[str]]:
    """The served candidates and their labels: every vocabulary value of a single vocabulary candidate feature;
    else every candidate seen in the data, one per ID of the first candidate feature (its other features,
    multivalent ones too, from its first row), labelled by that ID's value. Each candidate is its embedding
    ([U, d] float32) for a two-tower model, its ID ([U] int64) for an item-to-item one (which scores IDs).
    artifact: the served one (pruned, with `pruning`: the data's candidates are then pruned too)."""
    names = list(cfg.model.candidate_features)
    owner = cfg.table_owner(cfg.sparse_by_name[names[0]])
    by_id = hasattr(model, "id_scores")
    if index_is_vocabulary(cfg) or by_id and owner.vocab is not None:
        values = artifact.vocabularies[owner.name]
        ids = np.array([i for i, v in enumerate(values) if v is not None], dtype=np.int64)  # not free slots
        labels = [values[i] for i in ids.tolist()]
        if by_id:
            return ids, labels
        emb = np.concatenate([model.candidate_embedding({names[0]: tf.constant(ids[i:i + 8192])}).numpy()
                              for i in range(0, len(ids), 8192)])
        return emb, labels
    candidates, _ = read_clicks(cfg, data_dir, ("train", "validation", "eval"))
    if pruning is not None:
        candidates = pruned_candidates(pruning, names, candidates)
    vocab = artifact.vocabularies.get(owner.name) if owner.vocab is not None else None
    labels = [vocab[i] if vocab is not None and i < len(vocab) else str(i) for i in candidates.ids.tolist()]
    if by_id:
        return candidates.ids.astype(np.int64), labels
    multivalent = {n for n in names if cfg.sparse_by_name[n].multivalent}
    emb = np.concatenate([model.candidate_embedding(candidates.batch(i, i + 8192, multivalent)).numpy()
                          for i in range(0, len(candidates.ids), 8192)])
    return emb, labels


def _retrieval_module(cfg, artifact: TransformArtifact, model: tf.keras.Model, data_dir: str,
                      top_k: int, pruning: Optional[Pruning] = None) -> tuple[tf.Module, dict]:
    """cfg: the TRAINING config (its model section names the towers' features). Signatures: serving_default
    (the top k candidates and their scores) and query_output(model)'s (what the skew check compares)."""
    index, labels = _candidate_index(cfg, artifact, model, data_dir, pruning)
    by_id = hasattr(model, "id_scores")
    module = tf.Module()
    module.transform = FeatureTransform(artifact)
    module.weights = list(model.variables)  # as in _ranking_module
    module.index = tf.Variable(index, trainable=False, name="candidate_ids" if by_id else "candidate_embeddings")
    module.labels = tf.Variable(labels, trainable=False, dtype=tf.string, name="candidate_labels")
    k = min(top_k, len(labels))
    # item_to_item: its one input, the history or the user's key (its other query features are no input of it)
    spec = request_spec(artifact, [model.query_input] if by_id else list(cfg.model.query_features))
    output, direct = query_output(model)

    @tf.function(input_signature=[spec], autograph=False)
    def query(inputs):
        return {output: direct(module.transform(canonicalize_request(inputs, artifact)))}

    query_fn = query.get_concrete_function()

    @tf.function(input_signature=[spec], autograph=False)
    def serve(inputs):
        q = query_fn(inputs)[output]
        scores = tf.gather(q, module.index, axis=1) if by_id else tf.matmul(q, module.index, transpose_b=True)
        top = tf.math.top_k(scores, k=k)
        return {"candidates": tf.gather(module.labels, top.indices), "scores": top.values}

    return module, {"serving_default": serve.get_concrete_function(), output: query_fn}


def query_output(model: tf.keras.Model) -> tuple[str, Callable]:
    """What a retrieval model computes for a query, as an export names it, and the model's function for it.

    Args:
        model: a trained retrieval model.

    Returns:
        ("query_scores", model.id_scores) for an item-to-item model (a score per candidate ID),
        ("query_embedding", model.query_embedding) for a two-tower one.
    """
    return ("query_scores", model.id_scores) if hasattr(model, "id_scores") else \
        ("query_embedding", model.query_embedding)


class SkewError(RecpipeError, RuntimeError):
    """The exported graph and the training path disagree on the same raw rows."""


class ExportError(RecpipeError, ValueError):
    pass


def differing_features(artifact: TransformArtifact, sample: pa.Table, preprocessed: dict,
                       specs: dict, tolerance: float = SKEW_TOLERANCE) -> list[str]:
    """The features whose serving-graph transform of the raw sample differs from the Beam job's record:
    where a skew check failure comes from."""
    request = request_from_arrow(sample, string_ids(specs), list_separators(artifact.config))
    served = FeatureTransform(artifact)(canonicalize_request(request, artifact))
    out = []
    for name, value in served.items():
        if name not in preprocessed:
            continue
        a, b = value, preprocessed[name]
        if isinstance(a, tf.RaggedTensor) or isinstance(b, tf.RaggedTensor):
            same = a.to_list() == b.to_list() if isinstance(a, tf.RaggedTensor) and isinstance(b, tf.RaggedTensor) \
                else False
        else:
            x, y = np.asarray(a.numpy(), np.float64), np.asarray(b.numpy(), np.float64)
            same = x.shape == y.shape and bool(np.all((np.abs(x - y) <= tolerance) | (np.isnan(x) & np.isnan(y))))
        if not same:
            out.append(name)
    return out


def _eval_sample(model_dir: ModelDir, data_dir: Optional[str], artifact: TransformArtifact) -> PreprocessedData:
    """The preprocessed data whose eval sample feeds the skew check: --data, else the model's own; its
    transform must be the model's (`artifact`), or its records hold IDs that stand for other values."""
    trained_on = model_dir.data_dir()
    data_dir = data_dir or trained_on
    if data_dir is None:
        raise FileNotFoundError(f"{model_dir.root}: cannot tell which preprocessed data it was trained on; "
                                f"pass --data")
    data = PreprocessedData(data_dir)
    check_same_transform(artifact, data.transform(), model_dir.root, data.root,
                         "Export with the data it was trained on"
                         + model_dir.trained_on_hint(data.root, " (leave --data out: {})"))
    for p in (data.eval_sample_parquet, data.eval_sample_records):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p}: no eval sample for the skew check (re-run `recpipe preprocess`)")
    return data


def skew_check(signature, output: str, trained: np.ndarray, sample: pa.Table, separators: dict[str, str],
               tolerance: float = SKEW_TOLERANCE) -> dict:
    """The same eval rows scored through the exported `signature` from RAW columns and by the trainer's
    model from their PREPROCESSED record (written by the Beam job's transform): `trained`, one output
    per sample row. Ranking compares scores, retrieval query embeddings. Rows with a null in an integer
    ID column are left out: an int64 input cannot carry it (examples_check scores them as tf.Examples).
    separators: each list column's (canonical.list_separators), which its rows are joined by."""
    if len(trained) != sample.num_rows:
        raise SkewError(f"skew check: {sample.num_rows} raw vs {len(trained)} preprocessed eval sample rows; the "
                        f"eval sample files do not match")
    specs = dict(signature.structured_input_signature[1])
    carried = ~int64_nulls(sample, specs)
    served = signature(**request_from_arrow(sample.filter(pa.array(carried)), specs, separators))[output].numpy()
    trained = trained[carried]
    diff = np.abs(served.astype(np.float64) - trained.astype(np.float64)).reshape(len(served), -1)
    per_row = diff.max(axis=1) if diff.size else np.zeros(0)
    return {"rows": int(len(per_row)), "rows_left_out": int((~carried).sum()), "compared": output,
            "tolerance": tolerance,
            "max_abs_diff": float(per_row.max()) if len(per_row) else 0.0,
            "mean_abs_diff": float(diff.mean()) if diff.size else 0.0,
            "worst_row": int(np.flatnonzero(carried)[np.argmax(per_row)]) if len(per_row) else -1,  # sample row
            "passed": bool(len(per_row) and per_row.max() <= tolerance)}


def sample_auc(version: ExportedVersion, sample: pa.Table) -> float:
    """AUC of a ranking version's served scores on raw log rows (e.g. an eval sample), by its own label
    column: through predict_examples, which takes every row (a null integer ID too), when the version
    has it (the export checks it scores every row as the trainer does), else serving_default."""
    signatures, meta = tf.saved_model.load(version.path).signatures, version.meta()
    cfg = meta.typed_config()
    if EXAMPLES_SIGNATURE in signatures:
        examples = tf.constant(examples_from_arrow(sample, cfg, meta.raw_schema))
        scores = signatures[EXAMPLES_SIGNATURE](**{EXAMPLES_INPUT: examples})["score"].numpy()
    else:
        fn = signatures["serving_default"]
        request = request_from_arrow(sample, dict(fn.structured_input_signature[1]), list_separators(cfg))
        scores = fn(**request)["score"].numpy()
    label = cfg.label.column
    return roc_auc(sample.column(label).to_numpy(zero_copy_only=False).astype(float), scores)


def _candidate_truth(cfg, artifact: TransformArtifact, sample: pa.Table) -> list[str]:
    """Each row's clicked candidate as a retrieval export labels its index: the value of the first candidate
    feature (canonical, as its vocabulary holds it), or, when its table is hashed, the bucket's ID."""
    name = cfg.model.candidate_features[0]
    if cfg.table_owner(cfg.sparse_by_name[name]).vocab is not None:
        return canonicalize(sample, cfg)[name].to_pylist()
    spec = {name: tf.TensorSpec([None], tf.string)}
    ids = FeatureTransform(artifact)(canonicalize_request(request_from_arrow(sample, spec), artifact))[name]
    return [str(i) for i in ids.numpy().tolist()]


def _hits(serve, specs: dict, sample: pa.Table, truth: list[str], separators: dict[str, str]) -> np.ndarray:
    """Per row, whether a retrieval signature's top candidates for its query hold the row's clicked one."""
    top = serve(request_from_arrow(sample, specs, separators))["candidates"].numpy()
    return np.array([t in {c.decode() for c in row} for t, row in zip(truth, top)], dtype=bool)


def same_rows_recall(served: ExportedVersion, cfg, artifact: TransformArtifact, model: tf.keras.Model, data_dir: str,
                     sample: pa.Table) -> dict:
    """recall@k of a served retrieval version and of a trained retrieval `model` (with the candidate index an
    export of it from `data_dir` would hold) on the SAME raw rows: the sample's clicks, k the served
    version's top k. Each recommends from its own index, as each would serve."""
    clicks = sample.filter(pc.greater(pc.cast(sample.column(cfg.label.column), pa.float64()), 0.5))
    signature = tf.saved_model.load(served.path).signatures["serving_default"]
    k = int(signature.structured_outputs["candidates"].shape[-1])
    ours = _retrieval_module(cfg, artifact, model, data_dir, k)[1]["serving_default"]  # takes the request dict
    truth = _candidate_truth(cfg, artifact, clicks)
    ours_sep = list_separators(artifact.config)  # each graph splits lists on its own transform's separators
    served_meta = served.meta()
    served_sep = list_separators(served_meta.typed_config()) if served_meta is not None else ours_sep
    new = _hits(ours, dict(ours.structured_input_signature[0][0]), clicks, truth, ours_sep)
    old = _hits(lambda request: signature(**request), dict(signature.structured_input_signature[1]), clicks, truth,
                served_sep)
    rows = clicks.num_rows
    return {"k": k, "rows": rows, "new": float(new.mean()) if rows else math.nan,
            "served": float(old.mean()) if rows else math.nan}


def examples_check(examples_fn, trained: np.ndarray, sample: pa.Table, artifact: TransformArtifact) -> dict:
    """The eval sample's raw rows as serialized tf.Examples through `predict_examples` against the
    trainer's scores of their preprocessed records (`trained`), every row: a null integer ID too, which
    serving_default's int64 input cannot carry (skew_check leaves such rows to this check)."""
    examples = tf.constant(examples_from_arrow(sample, artifact.config, artifact.raw_schema))
    via_examples = examples_fn(**{EXAMPLES_INPUT: examples})["score"].numpy()
    same_shape = trained.shape == via_examples.shape
    diff = float(np.max(np.abs(trained.astype(np.float64) - via_examples))) if same_shape and len(trained) else 0.0
    return {"examples_rows": int(len(via_examples)), "examples_max_abs_diff": diff,
            "examples_passed": bool(same_shape and len(trained) and diff <= SKEW_TOLERANCE)}


EXPORT_LOCK_WAIT_S = 600.0  # how long an export waits for another one into the same export base


def export_model(model_dir: str, export_base: str, version: int | None = None, data_dir: str | None = None,
                 top_k: int = 10, metrics: dict | None = None, embedding_dtype: str = "float32",
                 dense_dtype: str = "float32", prune_unseen_days: int | None = None) -> str:
    """Write EXPORT_BASE/<version>/ atomically after a passing skew check; return its path.
    metrics: the model's eval metrics, recorded in the version's ExportMeta. embedding_dtype /
    dense_dtype: how the embedding tables / Dense kernels are stored (recpipe.serving.export.quantize); the skew check
    compares against the trained model with the same stored weights, so it stays exact.
    prune_unseen_days: serve only the vocabulary values seen in the artifact's last D days
    (recpipe.serving.export.prune); the others map to OOV, and the skew check's reference is the eval sample
    transformed with the pruned vocabularies, itself checked against the Beam job's records. In a
    retrieval export the pruned candidates leave the index (a value unseen for D days is not
    recommended), whether the index is a vocabulary or read from the data (recpipe.serving.export.prune's
    pruned_candidates), and pruned query values map to OOV."""
    md = ModelDir(model_dir)
    cfg, artifact, model = md.load_trained(serving=True)
    data = _eval_sample(md, data_dir, artifact)
    sample = pq.read_table(data.eval_sample_parquet)
    preprocessed = read_single_batch(cfg, data.eval_sample_records)
    pruning = None
    if prune_unseen_days is not None:
        pruning = prune_vocabularies(artifact, prune_unseen_days)
        prune_model(model, pruning.rows)
        artifact, preprocessed = pruning.artifact, pruned_records(pruning, sample, preprocessed)
    weights = quantize_model(model, embedding_dtype, dense_dtype)
    if pruning is not None:
        weights["pruned"] = pruning.report
    if version is not None and not 0 < version < 2 ** 63:
        raise ExportError(f"--version {version}: versions are positive integers (TF Serving's layout)")
    base = ExportBase(export_base)
    with base.writer_lock(wait_s=EXPORT_LOCK_WAIT_S):  # one export picks and publishes a version at a time
        base.remove_stale_temp()
        version = version if version is not None else base.next_version()
        final = base.version(version)
        if os.path.exists(final.path):
            raise FileExistsError(f"{final.path}: version {version} already exists")
        os.makedirs(export_base, exist_ok=True)
        staged = ExportedVersion(
            os.path.join(export_base, f"{TEMP_PREFIX}{version}-{os.getpid()}-{uuid.uuid4().hex[:8]}"), version)
        try:
            if cfg.model.task == "retrieval":
                module, signatures = _retrieval_module(cfg, artifact, model, data.root, top_k, pruning)
                output, direct = query_output(model)
                compare = output
            else:
                module, signatures = _ranking_module(artifact, model)
                compare, output, direct = "serving_default", "score", lambda f: tf.sigmoid(model(f))[:, 0]
            tf.saved_model.save(module, staged.path, signatures=signatures)
            staged.write_meta(ExportMeta(config_to_dict(artifact.config), artifact.raw_schema, os.path.abspath(model_dir),
                                         version, dict(metrics or {}), weights))
            loaded = tf.saved_model.load(staged.path)
            serve_fn = loaded.signatures["serving_default"]
            smoke = serve_fn(**{k: tf.constant(v) for k, v in
                                missing_rows(dict(serve_fn.structured_input_signature[1]), 2).items()})
            if not all(np.all(np.isfinite(v.numpy())) for v in smoke.values() if v.dtype.is_floating):
                raise RuntimeError(f"{staged.path}: the exported model returns non-finite scores")
            trained = direct(preprocessed).numpy()
            report = skew_check(loaded.signatures[compare], output, trained, sample,
                                list_separators(artifact.config))
            if EXAMPLES_SIGNATURE in loaded.signatures:
                report.update(examples_check(loaded.signatures[EXAMPLES_SIGNATURE], trained, sample, artifact))
            if not report["passed"]:
                report["differing_features"] = differing_features(
                    artifact, sample, preprocessed, dict(loaded.signatures[compare].structured_input_signature[1]))
            staged.write_skew_report(report)
            if not report["passed"]:
                where = (f"the transform of {', '.join(report['differing_features'])} differs between serving and the "
                         f"Beam job" if report["differing_features"] else "the features agree, the models differ")
                raise SkewError(f"skew check failed: max |served - trainer| = {report['max_abs_diff']:.3g} > "
                                f"{report['tolerance']:g} on {report['rows']} eval rows (worst row {report['worst_row']}): "
                                f"{where}")
            if not report.get("examples_passed", True):
                raise SkewError(f"{EXAMPLES_SIGNATURE} scores the eval sample's rows as tf.Examples differently from "
                                f"the trainer (max |diff| {report['examples_max_abs_diff']:.3g})")
            write_warmup(staged.warmup_path, warmup_logs(serve_fn, EXAMPLES_SIGNATURE in loaded.signatures, sample,
                                                         artifact.config, artifact.raw_schema))
            load_version(staged.path, version, loaded)  # as the model server loads it, warmup replayed, or fails here
            os.rename(staged.path, final.path)
        except BaseException:
            shutil.rmtree(staged.path, ignore_errors=True)
            raise
    return final.path
