"""How a training job runs — strategy, precision, steps, processes — declared once.

`RunOptions` is the one typed spec behind `recpipe train`'s flags (argparse choices come from
it), the Python API (`TrainOptions.run`) and the daily project YAML (its `train:` mapping); every
value is validated by the same code, with the key named. No TensorFlow here: the CLI builds its
parser from this module before TensorFlow loads.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Optional

from recpipe.common.errors import ConfigError
from recpipe.common.typed_yaml import check_typed
from recpipe.trainers.errors import TrainError

__all__ = ["Strategy", "Precision", "RunOptions", "TrainOptions", "run_flags", "host_list"]

Strategy = Literal["local", "ps", "horovod", "auto"]
Precision = Literal["fp32", "bf16", "fp16"]


def host_list(spec: str) -> list[tuple[str, int]]:
    """horovodrun's -H syntax, "h1:2,h2" -> [("h1", 2), ("h2", 1)]."""
    out = []
    for item in spec.split(","):
        host, _, slots = item.strip().partition(":")
        if not host or (slots and not slots.isdigit()) or (slots and int(slots) < 1):
            raise TrainError(f"hosts: {item!r} in {spec!r} is not HOST or HOST:SLOTS")
        out.append((host, int(slots) if slots else 1))
    if len({h for h, _ in out}) != len(out):
        raise TrainError(f"hosts: {spec!r} names a host twice")
    return out


def _opt(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class RunOptions:
    strategy: Strategy = _opt("local", "ps: ParameterServerStrategy, the cluster from TF_CONFIG or started on "
                                       "127.0.0.1; horovod: ring-allreduce over Gloo, --np ranks on this host via "
                                       "horovodrun; auto: ask the advisor (see `recpipe advise`)")
    precision: Precision = _opt("fp32", "fp32, or mixed precision with bf16/fp16 compute (variables stay fp32)")
    steps: Optional[int] = _opt(None, "total steps (default: train.steps of the config)")
    np: int = _opt(2, "--strategy horovod: ranks to start on this host")
    threads: int = _opt(0, "intra/inter-op threads of each training process (default: train.tuning."
                           "intra_op_threads / inter_op_threads)")
    hosts: Optional[str] = _opt(None, "--strategy horovod across hosts without ssh: H1[:SLOTS],H2[:SLOTS],... "
                                      "(horovodrun's -H syntax). Run the same command on every host with its own "
                                      "--host-index; rank 0 and the rendezvous server run on the first host")
    host_index: int = _opt(0, "--hosts: which of the hosts this one is (0 = the first)")
    rendezvous_port: int = _opt(29500, "--hosts: TCP port of the rendezvous server on the first host")
    ps_workers: int = _opt(2, "--strategy ps without TF_CONFIG: worker processes")
    ps_servers: int = _opt(2, "--strategy ps without TF_CONFIG: PS processes")
    ps_task_threads: int = _opt(0, "--strategy ps: intra/inter-op threads per task (0: TF default)")
    cluster_wait_seconds: int = _opt(600, "--strategy ps from TF_CONFIG: how long the coordinator waits for every "
                                          "PS and worker task to serve (tasks may start minutes apart) before it "
                                          "stops, naming the ones that do not")
    max_restarts: int = _opt(0, "--strategy ps or horovod: how many times the job starts again from its last "
                                "checkpoint after a PS task, rank or host is lost (as torchrun's --max-restarts); "
                                "0: it stops, naming what was lost")
    task_timeout_seconds: int = _opt(30, "--strategy ps: how long a PS or worker task may not answer the coordinator "
                                         "(its host cut off from the network, or its process gone) before it is "
                                         "declared lost: a PS task stops the job, naming it; a worker's steps run "
                                         "on the other workers until it answers again")

    def __post_init__(self):
        try:
            check_typed(self)
        except ConfigError as e:
            raise TrainError(str(e)) from None
        for key, low in (("steps", 1), ("np", 1), ("threads", 0), ("ps_workers", 1), ("ps_servers", 1),
                         ("ps_task_threads", 0), ("host_index", 0), ("rendezvous_port", 1),
                         ("cluster_wait_seconds", 1), ("task_timeout_seconds", 1),
                         ("max_restarts", 0)):
            value = getattr(self, key)
            if value is not None and value < low:
                raise TrainError(f"{key}: must be >= {low}, got {value}")
        if self.hosts is not None:
            if self.strategy != "horovod":
                raise TrainError(f"hosts: --hosts starts each host's Horovod ranks; it needs --strategy horovod, not "
                                 f"{self.strategy}")
            hosts = host_list(self.hosts)
            if self.host_index >= len(hosts):
                raise TrainError(f"host_index: {self.host_index} is not one of the {len(hosts)} hosts in "
                                 f"{self.hosts!r}")


@dataclass(frozen=True)
class TrainOptions:
    data_dir: str                      # a `recpipe preprocess` output
    model_dir: str                     # checkpoints go here; rerunning resumes
    config_path: Optional[str] = None  # default: the model dir's own config, else the data's
    run: RunOptions = field(default_factory=RunOptions)
    warm_start: Optional[str] = None   # a previous model dir to initialise a NEW model from
    synthetic_input: bool = False      # benchmarks: one random in-memory batch instead of the shards


def run_flags(run: RunOptions) -> list[str]:
    """`recpipe train` flags that reproduce `run` (fields left at their defaults are omitted)."""
    out = []
    for f in dataclasses.fields(run):
        value = getattr(run, f.name)
        if value != f.default:
            out += [f"--{f.name.replace('_', '-')}", str(value)]
    return out
