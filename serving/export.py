"""Export a trained model as a SavedModel whose `serving_default` takes RAW log columns.

EXPORT_BASE/<version>/saved_model.pb (+ variables/, assets.extra/recpipe.json) is TF Serving's
versioned layout. The feature transform (vocabulary tables, hashing, dense normalisation) is the
same features.transform.FeatureTransform the Beam job ran, embedded in the graph. A version is
written to a hidden temp folder, loaded, called, and skew-checked: up to 1000 raw eval rows kept by
the Beam job are scored through the exported signature and through the Beam/trainer path, and the
export fails if any score differs by more than 1e-5 (`<version>/skew_check.json` records it). Only
then is the folder renamed into place.
"""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tensorflow as tf  # noqa: E402

from features.artifact import TransformArtifact  # noqa: E402
from features.config import config_to_dict  # noqa: E402
from features.canonical import LABEL_KEY, canonicalize  # noqa: E402
from features.transform import (FeatureTransform, canonical_to_tensors, canonicalize_request,  # noqa: E402
                                request_from_arrow, request_spec)
from trainers.train import load_trained  # noqa: E402

__all__ = ["export_model", "existing_versions", "example_request", "skew_check", "SkewError", "SKEW_TOLERANCE"]

SKEW_TOLERANCE = 1e-5


def existing_versions(export_base: str) -> list[int]:
    if not os.path.isdir(export_base):
        return []
    return sorted(int(d) for d in os.listdir(export_base)
                  if d.isdigit() and os.path.isfile(os.path.join(export_base, d, "saved_model.pb")))


def _next_version(export_base: str) -> int:
    now = int(time.time())
    versions = existing_versions(export_base)
    return max(now, versions[-1] + 1) if versions else now


def _serving_module(artifact: TransformArtifact, model: tf.keras.Model) -> tf.Module:
    module = tf.Module()
    module.transform = FeatureTransform(artifact)
    module.model = model
    spec = request_spec(artifact)

    @tf.function(input_signature=[spec])
    def serve(inputs):
        features = module.transform(canonicalize_request(inputs, artifact))
        return {"score": tf.sigmoid(module.model(features))[:, 0]}

    module.serve = serve
    return module


def example_request(artifact: TransformArtifact, n: int = 2) -> dict[str, np.ndarray]:
    """A request of n all-missing rows, with the dtypes the signature expects."""
    out = {}
    for name, spec in request_spec(artifact).items():
        if spec.dtype == tf.string:
            out[name] = np.array([b""] * n, dtype=object)
        elif spec.dtype == tf.int64:
            out[name] = np.zeros(n, np.int64)
        else:
            out[name] = np.full(n, np.nan, np.float32)
    return out


class SkewError(RuntimeError):
    """The exported graph and the training path disagree on the same raw rows."""


def _eval_sample_path(model_dir: str, data_dir: str | None) -> str:
    if data_dir is None:
        state_path = os.path.join(model_dir, "train_state.json")
        data_dir = json.load(open(state_path)).get("data_dir") if os.path.exists(state_path) else None
    if data_dir is None:
        raise FileNotFoundError(f"{model_dir}: cannot tell which preprocessed data it was trained on; pass --data")
    path = os.path.join(data_dir, "eval_sample.parquet")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no raw eval sample for the skew check (re-run `recpipe preprocess`)")
    return path


def skew_check(serve_fn, model: tf.keras.Model, artifact: TransformArtifact, sample: pa.Table,
               tolerance: float = SKEW_TOLERANCE) -> dict:
    """Score the same raw rows through the serving signature and through Arrow canonicalisation +
    FeatureTransform + the trainer's model (what the Beam job and the trainer compute)."""
    cfg = artifact.config
    served = serve_fn(**request_from_arrow(sample, dict(serve_fn.structured_input_signature[1])))["score"].numpy()
    canon = canonicalize(sample, cfg)
    feats = FeatureTransform(artifact)(canonical_to_tensors({k: v for k, v in canon.items() if k != LABEL_KEY}))
    direct = tf.sigmoid(model(feats))[:, 0].numpy()
    diff = np.abs(served.astype(np.float64) - direct.astype(np.float64))
    worst = int(np.argmax(diff)) if len(diff) else -1
    return {"rows": int(len(diff)), "tolerance": tolerance, "max_abs_diff": float(diff.max()) if len(diff) else 0.0,
            "mean_abs_diff": float(diff.mean()) if len(diff) else 0.0, "worst_row": worst,
            "passed": bool(len(diff) and diff.max() <= tolerance)}


def export_model(model_dir: str, export_base: str, version: int | None = None, data_dir: str | None = None) -> str:
    """Write EXPORT_BASE/<version>/ atomically after a passing skew check; return its path."""
    cfg, artifact, model = load_trained(model_dir)
    if cfg.model.task != "ranking":
        raise ValueError(f"{model_dir}: a {cfg.model.task} model; this export writes ranking models (raw row in, "
                         f"score out). Retrieval export (query model + candidate index) is not built yet")
    sample = pq.read_table(_eval_sample_path(model_dir, data_dir))
    version = version if version is not None else _next_version(export_base)
    final = os.path.join(export_base, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final}: version {version} already exists")
    os.makedirs(export_base, exist_ok=True)
    tmp = os.path.join(export_base, f".tmp-{version}-{uuid.uuid4().hex[:8]}")
    quiet = tf.get_logger().level
    try:
        module = _serving_module(artifact, model)
        # The unbuilt training-only Ranking task triggers a harmless "skipping serialization" warning.
        tf.get_logger().setLevel("ERROR")
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve.get_concrete_function()})
        tf.get_logger().setLevel(quiet)  # loading and the smoke call below may warn for real
        os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
        with open(os.path.join(tmp, "assets.extra", "recpipe.json"), "w") as fh:
            json.dump({"config": config_to_dict(artifact.config), "raw_schema": artifact.raw_schema,
                       "model_dir": os.path.abspath(model_dir), "version": version}, fh, indent=1)
        loaded = tf.saved_model.load(tmp)
        serve_fn = loaded.signatures["serving_default"]
        scores = serve_fn(**{k: tf.constant(v) for k, v in example_request(artifact).items()})["score"]
        if not np.all(np.isfinite(scores.numpy())):
            raise RuntimeError(f"{tmp}: the exported model returns non-finite scores")
        report = skew_check(serve_fn, model, artifact, sample)
        with open(os.path.join(tmp, "skew_check.json"), "w") as fh:
            json.dump(report, fh, indent=1)
        if not report["passed"]:
            raise SkewError(f"skew check failed: max |served - trainer| = {report['max_abs_diff']:.3g} > "
                            f"{report['tolerance']:g} on {report['rows']} eval rows (worst row {report['worst_row']})")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        tf.get_logger().setLevel(quiet)
    return final
