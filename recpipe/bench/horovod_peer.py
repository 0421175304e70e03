"""The peer of `train_horovod_vs_plain_horovod`: the same DCN-v2 trained the way Horovod's
Keras examples do it, one thread per rank.

Each rank builds the TFRS-tutorial model (recpipe.bench.tfrs_peer.TutorialDCN: one Keras Embedding
per table), takes its shard of the train split into memory (`Dataset.shard(size, rank)`, cached
before the clock starts), wraps the optimizer in `horovod.tensorflow.keras.DistributedOptimizer`
with dense gradients (`sparse_as_dense=True`: every embedding gradient allreduced as a dense tensor),
broadcasts rank 0's initial state with `BroadcastGlobalVariablesCallback` and calls `model.fit`.

Horovod's DistributedOptimizer allreduces inside `Optimizer._compute_gradients`, which Keras calls
from `optimizer.minimize(loss, vars, tape=tape)`. tfrs.Model's own train_step calls
`tape.gradient` + `apply_gradients` instead, which would skip the allreduce and let the ranks drift
apart silently, so the peer's train_step calls `minimize`, on a legacy Keras optimizer as Horovod
0.28 requires. Every rank reports a checksum of its weights: equal checksums prove the exchange.

    horovodrun -np N -H localhost:N --gloo python -m recpipe.bench.horovod_peer DATA CONFIG STEPS
    -> one JSON line per rank on stdout (rank 0's carries the rate and the eval AUC)
"""
from __future__ import annotations

import json
import sys

import numpy as np
import tensorflow as tf

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.bench.tfrs_peer import SecondHalfTimer, TutorialDCN, check_supported, in_memory
from recpipe.trainers.optim import optimizer_for
from recpipe.trainers.evaluation.scoring import ranking_scores

__all__ = ["HorovodTutorialDCN", "run_rank"]


class HorovodTutorialDCN(TutorialDCN):
    """TutorialDCN whose train_step goes through optimizer.minimize, where Horovod allreduces."""

    def train_step(self, inputs):
        with tf.GradientTape() as tape:
            loss = self.compute_loss(inputs, training=True)
            total = loss + sum(self.losses)
        self.optimizer.minimize(total, self.trainable_variables, tape=tape)
        return {**{m.name: m.result() for m in self.metrics}, "loss": loss}


def run_rank(data_dir: str, cfg: Config, steps: int) -> dict:
    import horovod.tensorflow.keras as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)  # one thread per rank, as our Horovod runs
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_supported(cfg)
    batch, half = cfg.train.batch_size, max(steps // 2, 1)
    train = in_memory(cfg, data_dir, "train")
    cached = (tf.data.Dataset.from_tensor_slices(train).shard(size, rank)
              .shuffle(int(train[LABEL_KEY].shape[0]) // size + 1, seed=cfg.train.seed + rank,
                       reshuffle_each_iteration=False)
              .batch(batch, drop_remainder=True).cache())
    for _ in cached:  # fill the cache before the clock starts
        pass
    tf.keras.utils.set_random_seed(cfg.train.seed)
    model = HorovodTutorialDCN(cfg, PreprocessedData(data_dir).transform().table_sizes())
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer_for(cfg, legacy=True), sparse_as_dense=True))
    timer = SecondHalfTimer()
    model.fit(cached.repeat(), steps_per_epoch=half, epochs=2, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer])
    weights = float(sum(np.abs(v.numpy()).sum(dtype=np.float64) for v in model.trainable_variables))
    out = {"rank": rank, "ranks": size, "weights_abs_sum": weights}
    if rank == 0:
        out.update(examples_per_s_steady=half * batch * size / timer.seconds, examples=2 * half * batch * size,
                   auc=ranking_scores(cfg, model, data_dir, "eval")["auc"])
    return out


def main(argv: list[str]) -> None:
    data_dir, cfg_path, steps = argv
    print(json.dumps(run_rank(data_dir, load_config(cfg_path), int(steps))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
