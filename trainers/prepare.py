"""What every `recpipe train` process does before it builds a model, without TensorFlow (a Horovod launcher
does it too): the model dir prepared for the data (its config and a copy of the transform), this host's
copy of the data checked whole, and the step the run ends at."""
from __future__ import annotations

from dataclasses import dataclass

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data_copy import check_whole_copy
from recpipe.trainers.model_dir import ModelDir
from recpipe.trainers.options import TrainOptions

__all__ = ["PreparedRun", "prepare_run"]


@dataclass(frozen=True)
class PreparedRun:
    cfg: Config
    artifact: TransformArtifact  # the model dir's copy: a rerun resumes on the same IDs
    total: int                   # the step the run ends at (--steps, else the config's train.steps)


def prepare_run(opts: TrainOptions) -> PreparedRun:
    data = PreprocessedData(opts.data_dir)
    cfg, artifact = ModelDir(opts.model_dir).prepare(data, opts.config_path)
    if not opts.synthetic_input:
        check_whole_copy(data)
    return PreparedRun(cfg, artifact, opts.run.steps if opts.run.steps is not None else cfg.train.steps)
