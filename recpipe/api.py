"""recpipe's Python API: the stages of the pipeline as functions, each over the entry point its
`recpipe` subcommand runs, each returning the artifact the next stage reads.

    import recpipe
    data = recpipe.preprocess("configs/synthetic.yaml", "logs/", "work/pre")
    model = recpipe.train(data, "work/model", steps=500)
    metrics = recpipe.evaluate(model, data)
    version = recpipe.export(model, "work/export", data=data)
    with recpipe.serve("work/export", rest_port=0) as server:
        ...  # TF Serving's REST API on http://127.0.0.1:{server.rest_port}/v1/models/default:predict
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from recpipe.features.config import Config, load_config
from recpipe.features.preprocessed import PreprocessedData

if TYPE_CHECKING:  # these modules load TensorFlow: imported when the function runs
    from recpipe.serving.server.serve import ModelServer
    from recpipe.serving.version import ExportedVersion
    from recpipe.trainers.model_dir import ModelDir

__all__ = ["preprocess", "train", "evaluate", "export", "serve"]

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _root(artifact) -> str:
    return artifact if isinstance(artifact, str) else artifact.root


def preprocess(config: Union[str, Config], input: str, output: str, *, beam_args: Optional[list[str]] = None,
               previous_transform: Optional[str] = None, day: Optional[str] = None,
               say: Say = _quiet) -> PreprocessedData:
    """Turn a Parquet click log into sparse ID features with Beam (`recpipe preprocess`).

    Args:
        config: the feature spec: a YAML path or a loaded Config.
        input: the log: a folder of dt=YYYY-MM-DD/ partitions, a Parquet file, or a glob.
        output: the folder to publish; it must not exist or be empty.
        beam_args: Beam pipeline options, e.g. ["--runner=DirectRunner", "--direct_num_workers=2"].
        previous_transform: an earlier run's output (or its transform/ folder) whose vocabularies this run
            extends; IDs of kept values never change.
        day: YYYY-MM-DD of this run, for the vocabularies' admission window and eviction (default: the
            input's latest dt= partition).
        say: receives one progress line at a time.

    Returns:
        The published output: its transform artifact, its train/validation/eval shards and dead letters.

    Raises:
        ConfigError: the config is invalid (the message names the file and key).
        RecpipeError: the input is unreadable or does not fit the config, or the output folder is not empty.
    """
    from recpipe.pipeline.preprocess import run_preprocess
    cfg = load_config(config) if isinstance(config, (str, os.PathLike)) else config
    result = run_preprocess(cfg, input, output, beam_args or [], say=say, previous_transform=previous_transform,
                            day=day)
    return PreprocessedData(result.output)


def train(data: Union[str, PreprocessedData], model_dir: str, *, config: Optional[str] = None,
          strategy: str = "local", precision: str = "fp32", steps: Optional[int] = None,
          warm_start: Optional[str] = None, say: Say = _quiet, **run_options: Any) -> ModelDir:
    """Train the config's model on preprocessed data (`recpipe train`); rerunning resumes.

    Args:
        data: a `preprocess` output.
        model_dir: where checkpoints, logs and the model's config go; an existing one is resumed.
        config: a YAML path whose model and train sections to use (default: the model dir's config, else the
            one the data was preprocessed with).
        strategy: "local", "ps" (ParameterServerStrategy), "horovod" or "auto" (ask the advisor).
        precision: "fp32", "bf16" or "fp16" (mixed precision; variables stay fp32).
        steps: total steps (default: train.steps of the config).
        warm_start: a previous model dir to initialise a new model from.
        say: receives one progress line at a time.
        **run_options: the other fields of recpipe.trainers.options.RunOptions (np, hosts, ps_workers, ...).

    Returns:
        The trained model's folder.

    Raises:
        TrainError: bad options, data that does not match the config, or a failed or stopped training.
    """
    from recpipe.trainers.model_dir import ModelDir
    from recpipe.trainers.options import RunOptions, TrainOptions
    from recpipe.trainers.train import train as run_training
    run = RunOptions(strategy=strategy, precision=precision, steps=steps, **run_options)
    run_training(TrainOptions(data_dir=_root(data), model_dir=model_dir, config_path=config, run=run,
                              warm_start=warm_start), say=say)
    return ModelDir(model_dir)


def evaluate(model: Union[str, ModelDir], data: Union[str, PreprocessedData], *, out: Optional[str] = None,
             slices: Optional[list[str]] = None) -> dict:
    """Score a trained model on the eval split of its data (`recpipe evaluate`).

    Args:
        model: a ModelDir or its path.
        data: the `preprocess` output the model was trained on.
        out: a JSON file to write the metrics to as well.
        slices: FEATURE[:value|activity[:TOP]] specs such as "country" or "user_id:activity:5", instead of
            the config's evaluate.slices.

    Returns:
        The metrics: auc, logloss, calibration, ... (ranking) or recall/ndcg/mrr at k (retrieval), the trivial
        baselines' scores under "baselines", per-slice figures under "slices", and under "undefined" why a
        metric the split cannot define is null.

    Raises:
        ConfigError: a slice spec is invalid.
        TrainError: the data is not the model's, or its eval split is empty or damaged.
    """
    from recpipe.trainers.evaluation.evaluate import evaluate as run_evaluation
    from recpipe.trainers.evaluation.slices import parse_slice
    return run_evaluation(_root(model), _root(data), out,
                          slices=[parse_slice(s) for s in slices] if slices is not None else None)


def export(model: Union[str, ModelDir], export_base: str, *, data: Union[str, PreprocessedData, None] = None,
           version: Optional[int] = None, embedding_dtype: str = "float32", dense_dtype: str = "float32",
           prune_unseen_days: Optional[int] = None, top_k: int = 10) -> ExportedVersion:
    """Export a trained model with the feature transform in its graph (`recpipe export`).

    The version is published only after its skew check: the SavedModel must score the eval sample's raw
    rows as the trainer scored the Beam job's features.

    Args:
        model: a ModelDir or its path.
        export_base: the folder of numbered versions TF Serving and `serve` read.
        data: the `preprocess` output the model was trained on (default: the one its train state names).
        version: the version number (default: one past the newest).
        embedding_dtype: how embedding tables are stored: "float32", "bfloat16" or "int8".
        dense_dtype: how Dense kernels are stored: "float32", "bfloat16" or "int8".
        prune_unseen_days: serve only the vocabulary values seen in the artifact's last D days.
        top_k: candidates a retrieval model returns.

    Returns:
        The published version.

    Raises:
        SkewError: the SavedModel does not score the eval sample as the trainer did.
        ExportError: the version exists, or the model or data is unusable.
    """
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.serving.version import ExportBase
    path = export_model(_root(model), export_base, version, _root(data) if data is not None else None, top_k,
                        embedding_dtype=embedding_dtype, dense_dtype=dense_dtype,
                        prune_unseen_days=prune_unseen_days)
    return next(v for v in ExportBase(export_base).versions() if v.path == path)


def serve(export_base: str, *, model_name: str = "default", host: str = "127.0.0.1", rest_port: int = 8501,
          grpc_port: Optional[int] = 8500, poll_seconds: float = 2.0, max_batch_rows: int = 0,
          batch_timeout_ms: float = 0.0) -> ModelServer:
    """Serve the newest good version under `export_base` over TF Serving's REST and gRPC APIs (`recpipe serve`).

    The server runs on background threads of this process and swaps to a newer version when one appears.

    Args:
        export_base: an export base, as `export` writes it.
        model_name: the name in the REST paths (/v1/models/NAME) and gRPC model specs.
        host: the address to bind.
        rest_port: the REST port (0: any free port; read it from the handle).
        grpc_port: the gRPC port (0: any free port; None: no gRPC).
        poll_seconds: how often to look for a new version.
        max_batch_rows: rows the server batches across requests (0: no batching).
        batch_timeout_ms: how long a batch waits for more requests.

    Returns:
        The started server (its rest_port and grpc_port are the bound ports); call stop(), or use it as a
        context manager.

    Raises:
        ServeError: bad options.
        RuntimeError: no loadable version under export_base.
    """
    from recpipe.serving.server.serve import ModelServer, ServeOptions
    return ModelServer(ServeOptions(export_base, model_name, host, rest_port, grpc_port, poll_seconds,
                                    max_batch_rows, batch_timeout_ms)).start()
