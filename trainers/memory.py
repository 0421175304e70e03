"""Will a training process's model state fit in the memory it may use? Checked before the embedding tables
are built, so a config whose tables cannot fit fails in its own words, naming the tables, instead of the
process being killed by the kernel's or its container's OOM killer with no message (`Killed`, exit 137;
in the daily DAG, then retried three times).

The state is every embedding table's float32 weights plus the optimizer's slots of the same shape
(Adagrad 1, Adam 2, SGD 0). What a process may use is recpipe.common.hostmem.available_memory(): the smaller of
the host's MemAvailable and its memory cgroup's headroom (a container's limit).
More state than that cannot fit: an error. Peak RSS measured in `recpipe bench` is about 1.6x the state
plus about 0.8 GiB of TensorFlow and input pipeline per process (the initialiser's copy of a table, the
allocator's slack): past that, a warning.

Who holds the state on a host (Holders): one local process; each Horovod rank of the host, a copy each;
a local PS cluster's PS tasks, one copy between them; a PS task of a cluster on several hosts, its share
(the tables sharded evenly over the PS tasks: MinSizePartitioner cuts a large table into as many shards).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config, embedding_dim
from recpipe.common.hostmem import GIB, available_memory
from recpipe.trainers.errors import TrainError
from recpipe.trainers.strategies.hvd_launch import inside_horovod_job
from recpipe.trainers.options import RunOptions, host_list

__all__ = ["StateSize", "Holders", "state_size", "memory_verdict", "check_memory", "holders_on_this_host"]

SLOTS = {"adagrad": 1, "adam": 2, "sgd": 0}
PEAK_PER_STATE = 1.6      # peak RSS per byte of state (bench: rss_mb_per_table_mb 1.57)
PEAK_BASE = 800 << 20     # peak RSS of a training process with small tables (bench: 0.7-0.8 GB)


@dataclass(frozen=True)
class StateSize:
    tables: dict[str, tuple[int, int]]  # table -> (rows, width)
    slots: int                          # optimizer slots per weight
    optimizer: str

    @property
    def weight_bytes(self) -> int:
        return sum(rows * width * 4 for rows, width in self.tables.values())

    @property
    def total(self) -> int:
        return self.weight_bytes * (1 + self.slots)


def state_size(cfg: Config, artifact: TransformArtifact) -> StateSize:
    """The embedding tables of the config (a wide logit's one-wide tables too) and the optimizer's slots."""
    one_wide = cfg.model.type == "logistic"
    tables = {}
    for name, rows in artifact.table_sizes().items():
        tables[name] = (rows, 1 if one_wide else embedding_dim(cfg, cfg.sparse_by_name[name]))
        if cfg.model.wide and not one_wide:
            tables[f"{name} (wide)"] = (rows, 1)
    return StateSize(tables, SLOTS[cfg.train.optimizer], cfg.train.optimizer)


@dataclass(frozen=True)
class Holders:
    """The processes of this host that hold the state: `processes` of them, each `share` of it."""
    processes: int = 1
    share: float = 1.0
    how: str = "per process"  # what one holder's figure is, in the message
    advice: str = "run fewer processes on this host, or shard the tables over PS tasks (--strategy ps)"

    @classmethod
    def ps_task(cls, num_ps: int) -> "Holders":
        return cls(1, 1 / num_ps, f"on this PS task, one of {num_ps} holding the sharded tables" if num_ps > 1
                   else "on this PS task, the only one",
                   "run more PS tasks, or give them hosts with more memory")

    @classmethod
    def local_ps(cls, num_ps: int) -> "Holders":
        return cls(1, 1.0, f"on this host (its {num_ps} PS tasks hold one copy between them)",
                   "run the PS tasks on other hosts (a TF_CONFIG cluster: README \"Running on a cluster\")")


def holders_on_this_host(run: RunOptions, tf_config_cluster: bool) -> Optional[Holders]:
    """Who this `recpipe train` has hold the embedding tables on this host (None: no one): one local process;
    the Horovod ranks of this host, a copy each (checked once, by their launcher; a rank started with --np 1
    holds its own); a local PS cluster's PS tasks, one copy between them; the chief of a TF_CONFIG cluster
    none (each PS task checks its own host: recpipe.trainers.train)."""
    if run.strategy == "local":
        return Holders()
    if run.strategy == "horovod" and not inside_horovod_job():
        return Holders(host_list(run.hosts)[run.host_index][1] if run.hosts else run.np)
    if run.strategy == "ps" and not tf_config_cluster:
        return Holders.local_ps(run.ps_servers)
    return None


def memory_verdict(state: StateSize, holders: Holders, available: int,
                   source: str) -> tuple[Optional[str], Optional[str]]:
    """(error, warning) for the holders of this state sharing `available` bytes."""
    by_size = sorted(state.tables.items(), key=lambda kv: -kv[1][0] * kv[1][1])
    largest = [kv for kv in by_size[:3] if kv[1][0] * kv[1][1] * 20 >= by_size[0][1][0] * by_size[0][1][1]]
    named = ", ".join(f"{name} {rows:,} x {width} ({rows * width * 4 * (1 + state.slots) / GIB:.2f} GiB)"
                      for name, (rows, width) in largest)
    n, held = holders.processes, int(state.total * holders.share)
    each = f"{held / GIB:.2f} GiB {holders.how}" + (f" x {n} processes" if n > 1 else "")
    what = (f"the embedding tables and their {state.optimizer} slots need {each} (float32 weights "
            f"{state.weight_bytes / GIB:.2f} GiB x {1 + state.slots}"
            f"{' in all' if holders.share < 1 else ''}); largest: {named}")
    if held * n > available:
        return (f"{what}, but {available / GIB:.1f} GiB is available ({source}): the process would be killed "
                f"for memory. Lower those tables' hash_buckets, vocab max_size or embedding_dim, or "
                f"{holders.advice}"), None
    peak = int(PEAK_BASE + PEAK_PER_STATE * held) * n
    if peak > available:
        return None, (f"{what}; peak memory is likely about {peak / GIB:.1f} GiB "
                      f"({PEAK_PER_STATE:g}x the state + {PEAK_BASE / GIB:.1f} GiB per process, as measured), over "
                      f"the {available / GIB:.1f} GiB available ({source}): the kernel may kill it")
    return None, None


def check_memory(cfg: Config, artifact: TransformArtifact, holders: Holders, say: Callable[[str], None]) -> None:
    """Raise a TrainError when the state its holders keep on this host cannot fit in the host's (or
    container's) memory; warn when their likely peak does not."""
    available, source = available_memory()
    error, warning = memory_verdict(state_size(cfg, artifact), holders, available, source)
    if error:
        raise TrainError(error)
    if warning:
        say(f"train: WARNING: {warning}")
