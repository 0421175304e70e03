"""What each pod of `recpipe cluster render` requests from the Kubernetes scheduler (its containers'
`resources.requests`): the project YAML's `resources:` mapping, and where a value is left out, a default
for the pod's role. A training pod's memory defaults to the trainer's own estimate of its peak
(recpipe.trainers.memory: PEAK_BASE per process + PEAK_PER_STATE x the model state the pod holds, as
`recpipe train` checks it against its host) times MEMORY_HEADROOM.

Before the day is preprocessed, a table's rows are known only from the config: hash_buckets, or a
vocabulary's max_size + oov_buckets. A vocabulary without max_size has no bound, and the estimate leaves
its table out (the render says which).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Optional

from recpipe.common.errors import ConfigError

__all__ = ["PodResources", "ResourcesSpec", "PodRequests", "MEMORY_HEADROOM", "ROLE_MEMORY"]

MEMORY_HEADROOM = 1.25  # requested memory per byte of the trainer's peak estimate (its input pipeline, allocator slack)
# a role's memory when the project gives none and no estimate applies
ROLE_MEMORY = {"preprocess": "4Gi", "control": "2Gi"}
_CPU = {"train": 2.0, "evaluate": 1.0, "control": 0.5}  # a role's cores when the project gives none (preprocess: --dask-threads)
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")


@dataclass(frozen=True)
class PodResources:
    cpu: Optional[float] = None     # cores each pod requests (0.5: half a core); null: the role's default
    memory: Optional[str] = None    # a Kubernetes quantity (512Mi, 8Gi); null: the role's default or estimate


@dataclass(frozen=True)
class ResourcesSpec:
    """The requests of each role's pods; see docs/cluster.md (Resources) for the defaults."""
    preprocess: PodResources = field(default_factory=PodResources)  # each Dask worker
    train: PodResources = field(default_factory=PodResources)       # each training pod
    evaluate: PodResources = field(default_factory=PodResources)    # the evaluate -> bless -> push pod
    control: PodResources = field(default_factory=PodResources)     # Dask scheduler and client, MPI launcher

    def __post_init__(self):
        for f in fields(self):
            pod = getattr(self, f.name)
            if pod.cpu is not None and not pod.cpu >= 0.001:
                raise ConfigError(f"resources.{f.name}.cpu: must be at least 0.001 (one millicore), got {pod.cpu}")
            if pod.memory is not None and not _QUANTITY.fullmatch(pod.memory):
                raise ConfigError(f"resources.{f.name}.memory: {pod.memory!r} is not a Kubernetes memory quantity "
                                  f"(a number with an optional suffix Ki, Mi, Gi, Ti, k, M, G, T: 512Mi, 8Gi)")


def _cpu(cores: float) -> str:
    milli = max(1, round(cores * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _mebibytes(n: float) -> str:
    return f"{math.ceil(n / (1 << 20))}Mi"


class _ConfigBounds:
    """What recpipe.trainers.memory.state_size reads of a TransformArtifact (rows per table), bounded by the
    config alone, before the day's vocabularies exist."""

    def __init__(self, rows: dict[str, int]):
        self._rows = rows

    def table_sizes(self) -> dict[str, int]:
        return self._rows


class PodRequests:
    """The `resources` of each role's containers, for one project.

    Args:
        spec: the project's `resources:` mapping.
        cfg: the project's feature config (its tables and optimizer give the model state).
        dask_threads: threads per Dask worker, a worker's default cores.
    """

    def __init__(self, spec: ResourcesSpec, cfg, dask_threads: int):
        from recpipe.trainers.memory import state_size
        self.spec, self.dask_threads = spec, dask_threads
        rows: dict[str, int] = {}
        self.unbounded: list[str] = []  # tables the memory estimate leaves out (vocabularies without max_size)
        for f in cfg.features.sparse:
            if f.share_embedding_with is not None:
                continue
            if f.hash_buckets is not None:
                rows[f.name] = f.hash_buckets
            elif f.vocab.max_size is not None:
                rows[f.name] = f.vocab.max_size + f.vocab.oov_buckets
            else:
                self.unbounded.append(f.name)
        self.state_bytes = state_size(cfg, _ConfigBounds(rows)).total

    def _requests(self, role: str, cpu: float, memory: str) -> dict:
        pod = getattr(self.spec, role)
        return {"requests": {"cpu": _cpu(pod.cpu if pod.cpu is not None else cpu),
                             "memory": pod.memory if pod.memory is not None else memory}}

    def estimate(self, share: float) -> str:
        """The trainer's peak estimate for one process, with MEMORY_HEADROOM.

        Args:
            share: the part of the model state the process holds (0 to 1).

        Returns:
            A memory quantity in Mi.
        """
        from recpipe.trainers.memory import PEAK_BASE, PEAK_PER_STATE
        return _mebibytes(MEMORY_HEADROOM * (PEAK_BASE + PEAK_PER_STATE * self.state_bytes * share))

    def preprocess(self) -> dict:
        """Returns a Dask worker's container `resources`."""
        return self._requests("preprocess", float(self.dask_threads), ROLE_MEMORY["preprocess"])

    def control(self) -> dict:
        """Returns the container `resources` of a pod that coordinates and holds no model: the Dask scheduler
        and client, the MPI launcher."""
        return self._requests("control", _CPU["control"], ROLE_MEMORY["control"])

    def train(self, share: float) -> dict:
        """A training pod's container `resources`.

        Args:
            share: the part of the model state its one process holds (0: none, a PS worker or chief).

        Returns:
            {"requests": {"cpu": ..., "memory": ...}}.
        """
        return self._requests("train", _CPU["train"], self.estimate(share))

    def evaluate(self) -> dict:
        """Returns the container `resources` of the evaluate -> bless -> push pod: one process with the whole
        model, as a local trainer."""
        return self._requests("evaluate", _CPU["evaluate"], self.estimate(1.0))

    def note(self) -> Optional[str]:
        """Returns what an estimated memory request leaves out (the unbounded tables), or None."""
        estimated = [r for r in ("train", "evaluate") if getattr(self.spec, r).memory is None]
        if not self.unbounded or not estimated:
            return None
        return (f"the {' and '.join(estimated)} memory requests count only the tables the config bounds: "
                f"{', '.join(self.unbounded)} have vocabularies without max_size, sized only by preprocess; give "
                f"them vocab.max_size, or set {' and '.join(f'resources.{r}.memory' for r in estimated)}")
