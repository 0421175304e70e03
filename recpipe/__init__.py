"""recpipe: Parquet click logs -> Beam sparse ID features -> TFRS training -> TF-Serving-compatible serving.

The stages as Python functions (each returns the artifact the next one reads):

    import recpipe
    data = recpipe.preprocess("configs/synthetic.yaml", "logs/", "work/pre")
    model = recpipe.train(data, "work/model")
    recpipe.evaluate(model, data)
    version = recpipe.export(model, "work/export", data=data)
    server = recpipe.serve("work/export")

Subpackages: recpipe.features (the feature spec, the artifacts, the one transform), recpipe.pipeline (Beam),
recpipe.trainers (models, strategies, evaluation), recpipe.serving (export and the model server),
recpipe.common (generic helpers), recpipe.bench (`recpipe bench`). Names are imported on first use, so
`import recpipe.features` does not load TensorFlow or Beam.
"""
from recpipe.common import tf_env  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from recpipe.common import arrow_env  # noqa: F401  (sets Arrow's memory pool before pyarrow loads)

__all__ = ["preprocess", "train", "evaluate", "export", "serve",
           "Config", "load_config", "PreprocessedData", "ModelDir", "ExportedVersion", "ModelServer", "RecpipeError"]

_HOMES = {"preprocess": "recpipe.api", "train": "recpipe.api", "evaluate": "recpipe.api", "export": "recpipe.api",
          "serve": "recpipe.api", "Config": "recpipe.features.config", "load_config": "recpipe.features.config",
          "PreprocessedData": "recpipe.features.preprocessed", "ModelDir": "recpipe.trainers.model_dir",
          "ExportedVersion": "recpipe.serving.version", "ModelServer": "recpipe.serving.server.serve",
          "RecpipeError": "recpipe.common.errors"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'recpipe' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
