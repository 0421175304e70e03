"""TF_CONFIG, the contract between a PS job and its cluster manager (see recpipe.trainers.strategies.ps), read
without TensorFlow: a Horovod launcher and the CLI's start-up read it before TensorFlow is imported."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

from recpipe.trainers.errors import TrainError

__all__ = ["PSCluster", "TFConfig", "TASK_TYPES", "tf_config"]


@dataclass(frozen=True)
class PSCluster:
    chief: str            # the coordinator, host:port routable from every task
    workers: list[str]
    ps: list[str]

    def spec(self) -> dict[str, list[str]]:
        return {"chief": [self.chief], "worker": list(self.workers), "ps": list(self.ps)}


TASK_TYPES = ("chief", "worker", "ps")


@dataclass(frozen=True)
class TFConfig:
    cluster: PSCluster
    task_type: str = "chief"
    task_index: int = 0


def _addresses(cluster: dict, job: str, required: bool = True) -> list[str]:
    value = cluster.get(job)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and ":" in a for a in value):
        raise TrainError(f"TF_CONFIG: cluster.{job} must be a non-empty list of host:port addresses, got {value!r}")
    return value


def tf_config() -> Optional[TFConfig]:
    """TF_CONFIG (set by a cluster manager), or None when it is not set. Errors name the key."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise TrainError(f"TF_CONFIG: not JSON ({e})") from None
    cluster = data.get("cluster") if isinstance(data, dict) else None
    if not isinstance(cluster, dict):
        raise TrainError("TF_CONFIG: needs a 'cluster' mapping of chief, worker and ps address lists")
    if "chief" not in cluster:
        raise TrainError("TF_CONFIG: cluster.chief is required: the host:port of the `recpipe train` coordinator, "
                         "routable from every worker and PS task (they connect back to it, e.g. for checkpoints)")
    chief = _addresses(cluster, "chief")
    if len(chief) != 1:
        raise TrainError(f"TF_CONFIG: cluster.chief must list exactly one address, got {chief}")
    unknown = sorted(set(cluster) - set(TASK_TYPES))
    if unknown:
        raise TrainError(f"TF_CONFIG: cluster.{unknown[0]}: not a ParameterServerStrategy job (use chief, worker, "
                         f"ps; evaluate with `recpipe evaluate` after training)")
    task = data.get("task") or {"type": "chief", "index": 0}
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type not in TASK_TYPES:
        raise TrainError(f"TF_CONFIG: task.type {task_type!r} is not one of {', '.join(TASK_TYPES)}")
    jobs = {"chief": chief, "worker": _addresses(cluster, "worker"), "ps": _addresses(cluster, "ps")}
    if not isinstance(index, int) or not 0 <= index < len(jobs[task_type]):
        raise TrainError(f"TF_CONFIG: task.index {index!r} is out of range for {len(jobs[task_type])} "
                         f"{task_type} task(s)")
    return TFConfig(PSCluster(chief[0], jobs["worker"], jobs["ps"]), task_type, index)
