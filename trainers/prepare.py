"""What every `recpipe train` process does before it builds a model, without TensorFlow (a Horovod launcher
does it too): the model dir prepared for the data (its config and a copy of the transform), this host's
copy of the data checked whole, a warning for a split with too few labels, and the step the run ends at."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data_copy import check_whole_copy
from recpipe.trainers.label_counts import label_count_warnings
from recpipe.trainers.model_dir import ModelDir
from recpipe.trainers.options import TrainOptions
from recpipe.trainers.strategies.hvd_launch import inside_horovod_job

__all__ = ["PreparedRun", "prepare_run"]


@dataclass(frozen=True)
class PreparedRun:
    cfg: Config
    artifact: TransformArtifact  # the model dir's copy: a rerun resumes on the same IDs
    total: int                   # the step the run ends at (--steps, else the config's train.steps)


def prepare_run(opts: TrainOptions, say: Callable[[str], None]) -> PreparedRun:
    """Prepare the model dir for the data, check this host's copy of it, and warn of thin splits.

    Args:
        opts: the train options.
        say: where the warnings go (recpipe.trainers.label_counts: a train or validation split with too few
            labels, from the counts of the data preprocessed; not for --synthetic-input, nor in a rank of a
            Horovod job, whose launcher said them).

    Returns:
        The config, the model dir's copy of the transform artifact and the step the run ends at.

    Raises:
        TrainError, ConfigError, ArtifactError: as ModelDir.prepare.
        DataError: this host's copy of the data is not whole.
    """
    data = PreprocessedData(opts.data_dir)
    cfg, artifact = ModelDir(opts.model_dir).prepare(data, opts.config_path)
    if not opts.synthetic_input:
        check_whole_copy(data)
        if not inside_horovod_job():
            # the data's own counts: the model dir's copy of the transform keeps those of its first data
            for line in label_count_warnings(cfg, TransformArtifact.read_meta(data.transform_dir).get("row_counts")
                                             or {}):
                say(line)
    return PreparedRun(cfg, artifact, opts.run.steps if opts.run.steps is not None else cfg.train.steps)
