"""Export a trained model as a SavedModel whose `serving_default` takes RAW log columns.

EXPORT_BASE/<version>/saved_model.pb (+ variables/, assets.extra/recpipe.json) is TF Serving's
versioned layout. The feature transform (vocabulary tables, hashing, dense normalisation) is the
same features.transform.FeatureTransform the Beam job ran, embedded in the graph. A version is
written to a hidden temp folder, loaded and called once, and only then renamed into place.
"""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from features.artifact import TransformArtifact  # noqa: E402
from features.config import config_to_dict  # noqa: E402
from features.transform import FeatureTransform, canonicalize_request, request_spec  # noqa: E402
from trainers.train import load_trained  # noqa: E402

__all__ = ["export_model", "existing_versions", "example_request"]


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


def export_model(model_dir: str, export_base: str, version: int | None = None) -> str:
    """Write EXPORT_BASE/<version>/ atomically; return its path."""
    cfg, artifact, model = load_trained(model_dir)
    if cfg.model.task != "ranking":
        raise ValueError(f"{model_dir}: a {cfg.model.task} model; this export writes ranking models (raw row in, "
                         f"score out). Retrieval export (query model + candidate index) is not built yet")
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
        scores = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in
                                                          example_request(artifact).items()})["score"]
        if not np.all(np.isfinite(scores.numpy())):
            raise RuntimeError(f"{tmp}: the exported model returns non-finite scores")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        tf.get_logger().setLevel(quiet)
    return final
