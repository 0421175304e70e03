"""Which PS task holds how many bytes of the model's state: every variable (an embedding table's shards one by
one) and every optimizer slot, summed by the task its device names. The chief says it once the model is built
(`train: PS task state MB: {...}`), so a PS task's memory can be set against its own share; no TensorFlow import
here, so it is a pure function of (device, bytes) pairs."""
from __future__ import annotations

import json
import re
from typing import Iterable, Optional

__all__ = ["STATE_LINE", "task_of", "bytes_by_task", "state_line", "parse_state_line"]

STATE_LINE = "train: PS task state MB: "
_TASK = re.compile(r"/job:([A-Za-z_]+)/(?:replica:\d+/)?task:(\d+)")


def task_of(device: str) -> Optional[str]:
    """The task a device string names.

    Args:
        device: e.g. "/job:ps/replica:0/task:1/device:CPU:0".

    Returns:
        "ps:1" (job:index), or None for a device naming no task (a local variable).
    """
    m = _TASK.search(device or "")
    return f"{m.group(1)}:{m.group(2)}" if m else None


def bytes_by_task(variables: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Bytes per task.

    Args:
        variables: (device, bytes) of every variable; a sharded variable's shards each on its own.

    Returns:
        {"ps:0": bytes, ...}, sorted by task; variables whose device names no task are left out.
    """
    out: dict[str, int] = {}
    for device, size in variables:
        task = task_of(device)
        if task is not None:
            out[task] = out.get(task, 0) + int(size)
    return dict(sorted(out.items()))


def state_line(by_task: dict[str, int]) -> str:
    """The line the chief says: STATE_LINE then {task: MB} as JSON."""
    return STATE_LINE + json.dumps({t: round(b / 2**20, 3) for t, b in by_task.items()})


def parse_state_line(text: str) -> Optional[dict[str, float]]:
    """{task: MB} from a run's output (the last STATE_LINE in it), or None when it has none.

    Args:
        text: the output of `recpipe train --strategy ps`.

    Returns:
        {"ps:0": MB, ...} or None.
    """
    lines = [line for line in text.splitlines() if line.startswith(STATE_LINE)]
    return json.loads(lines[-1][len(STATE_LINE):]) if lines else None
