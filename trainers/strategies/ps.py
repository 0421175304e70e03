"""ParameterServerStrategy: a cluster from TF_CONFIG, or N workers + M PS started on 127.0.0.1.

Every worker and PS task is its own process running a `tf.distribute.Server` (with the servers
in the coordinator's process, model.fit hangs). The coordinator is the `recpipe train` process (the
`chief` task): it builds the model under the strategy (embedding tables are split over the PS tasks
by TablePartitioner, dense weights stay whole), dispatches steps to the workers through model.fit,
and writes checkpoints.

TF_CONFIG is the contract with a cluster manager (Kubeflow's TFJob operator writes it; so can a
user), e.g. for the coordinator:
    {"cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", ...], "ps": ["10.0.0.4:2222", ...]},
     "task": {"type": "chief", "index": 0}}
`cluster.chief` is required and must be routable from every task: the PS tasks connect back to the
coordinator (e.g. while a checkpoint is written). The same command run with task type `worker` or
`ps` serves that task until it is killed. A worker that dies is rescheduled around by the
coordinator and rejoins when restarted (the local launcher restarts it; on a cluster, its manager).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable

import tensorflow as tf

from recpipe.common.ports import free_ports
from recpipe.trainers.errors import how_it_ended
from recpipe.trainers.strategies.ps_tasks import Task, silent_tasks
from recpipe.trainers.strategies.tf_config import PSCluster

__all__ = ["LocalPSCluster", "TablePartitioner", "make_strategy", "serve_task"]

MIN_SHARD_BYTES = 256 << 10


class TablePartitioner(tf.distribute.experimental.partitioners.Partitioner):
    """Shards the embedding tables over the PS tasks by MinSizePartitioner's rule (shards of at least
    `min_shard_bytes`, at most `max_shards`) and keeps every other variable whole on one PS task.
    A table is a variable of exactly a table's shape, so its optimizer slots shard alike. Dense kernels
    stay whole because Keras' mixed precision wraps them in an AutoCastVariable, which cannot hold a
    ShardedVariable: sharding every variable of 256 KiB or more would make `--strategy ps --precision bf16`
    fail on the default model's first Dense kernel of that size."""

    def __init__(self, table_shapes: set[tuple[int, int]], min_shard_bytes: int, max_shards: int):
        self.table_shapes = {tuple(s) for s in table_shapes}
        self.by_size = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=min_shard_bytes, max_shards=max_shards)

    def __call__(self, shape, dtype, axis=0):
        shape = tf.TensorShape(shape)
        if tuple(shape.as_list()) in self.table_shapes:
            return self.by_size(shape, dtype, axis)
        return [1] * shape.rank


def make_strategy(cluster: PSCluster, table_shapes: set[tuple[int, int]]
                  ) -> tf.distribute.experimental.ParameterServerStrategy:
    """The strategy of the coordinator (task chief 0): its server binds the chief address's port; the
    tables (`table_shapes`: rows x width, models.table_shapes) are sharded over the PS tasks."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.spec()), task_type="chief", task_id=0, rpc_layer="grpc")
    partitioner = TablePartitioner(table_shapes, MIN_SHARD_BYTES, len(cluster.ps))
    return tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def serve_task(cluster: dict[str, list[str]], job: str, index: int, threads: int = 0) -> None:
    """Run one worker/PS server until killed (the body of a task process); threads: intra-op pool (0: TF's)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    config = tf.compat.v1.ConfigProto()
    config.intra_op_parallelism_threads = threads
    # One inter-op thread deadlocks a worker (the step function waits on its own input pipeline's
    # ops; seen: every worker idle, the job hung), so a thread-limited task keeps two.
    config.inter_op_parallelism_threads = max(threads, 2) if threads else 0
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                  protocol="grpc", config=config, start=True)
    server.join()


class LocalPSCluster:
    """N worker + M PS task processes on 127.0.0.1; a dead worker is restarted on its port."""

    def __init__(self, workers: int = 2, ps: int = 2, threads_per_task: int = 0,
                 say: Callable[[str], None] = print):
        ports = free_ports(1 + workers + ps)
        self.cluster = PSCluster(f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{p}" for p in ports[1:1 + workers]],
                                 [f"127.0.0.1:{p}" for p in ports[1 + workers:]])
        self.threads = threads_per_task
        self.say = say
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.restarts = 0
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _start(self, job: str, index: int) -> None:
        env = dict(os.environ, RECPIPE_TASK_THREADS=str(self.threads), TF_CPP_MIN_LOG_LEVEL="3")
        env.pop("TF_CONFIG", None)
        cmd = [sys.executable, "-m", "recpipe.trainers.strategies.ps", json.dumps(self.cluster.spec()), job, str(index)]
        self.procs[(job, index)] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)

    def _wait_listening(self, timeout: float = 120.0) -> None:
        """Until every task accepts connections; stops the cluster and raises if one exits or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while silent := silent_tasks(self.cluster, ("worker", "ps"), timeout=1.0):
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PS cluster task {dead or silent[0][2]} did not start")
            time.sleep(0.2)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for (job, index), proc in list(self.procs.items()):
                if proc.poll() is not None and job == "worker" and not self._stop.is_set():
                    self.restarts += 1
                    self.say(f"train: worker {index} exited ({proc.returncode}); restarting it")
                    self._start(job, index)

    def dead_ps(self, grace: float = 0.0) -> list[Task]:
        """("ps", index, address, how it ended) of every PS task that has exited, as silent_tasks gives them (a
        PS is not restarted: its variables were in its memory), waiting up to `grace` seconds for one to: a
        killed task's connections reset while it is still exiting, so the chief's error can come before its
        exit status (1 run in 4 of a killed PS task on a loaded machine)."""
        deadline = time.monotonic() + grace
        while True:
            dead = [("ps", i, self.cluster.ps[i], how_it_ended(p.returncode))
                    for (job, i), p in sorted(self.procs.items()) if job == "ps" and p.poll() is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def start(self) -> "LocalPSCluster":
        for i in range(len(self.cluster.ps)):
            self._start("ps", i)
        for i in range(len(self.cluster.workers)):
            self._start("worker", i)
        self._wait_listening()
        self._watcher = threading.Thread(target=self._watch, name="ps-cluster-watch", daemon=True)
        self._watcher.start()
        self.say(f"train: local PS cluster up: {len(self.cluster.workers)} workers {self.cluster.workers}, "
                 f"{len(self.cluster.ps)} PS {self.cluster.ps}")
        return self

    def stop(self) -> None:
        self._stop.set()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()

    def __enter__(self) -> "LocalPSCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # python -m recpipe.trainers.strategies.ps CLUSTER_JSON JOB INDEX
    threads = int(os.environ.get("RECPIPE_TASK_THREADS", "0"))
    serve_task(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), threads)
