"""Checkpoints that are whole: finding a damaged one before restoring it, and falling back to older ones.

A full disk, a killed copy or a killed save leaves a checkpoint whose `.index` is missing, empty or
unreadable, whose `.data` shards are missing, or whose `.data` holds fewer bytes than its index lists;
TensorFlow then fails with "Read less bytes than requested", naming no file. The CheckpointManager keeps
several checkpoints, so resume, evaluate, export and warm start use the newest one that is whole and name
each damaged one.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
from typing import Callable, Optional, Sequence

from recpipe.trainers.errors import TrainError

__all__ = ["damage", "restore_newest_whole", "remove_temp_saves", "checkpoint_prefixes"]

_DATA = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
_STEP = re.compile(r"-(\d+)$")


def checkpoint_prefixes(directory: str) -> list[str]:
    """The checkpoints in a directory, newest (highest step) first, whole or not.

    Args:
        directory: a CheckpointManager's directory (prefixes `ckpt-<step>`).

    Returns:
        Every prefix that has an `.index` or a `.data` file.
    """
    found = {re.sub(r"\.(index|data-\d{5}-of-\d{5})$", "", path)
             for path in glob.glob(os.path.join(glob.escape(directory), "ckpt-*"))
             if path.endswith(".index") or _DATA.search(path)}
    return sorted((p for p in found if _STEP.search(p)), key=lambda p: int(_STEP.search(p)[1]), reverse=True)


def damage(prefix: str) -> Optional[str]:
    """Why the checkpoint `prefix` cannot be restored, found from its files without restoring it.

    Args:
        prefix: a checkpoint prefix (e.g. ROOT/checkpoints/ckpt-500).

    Returns:
        None when the index reads, every data shard exists and the shards hold at least the bytes of the
        numeric tensors the index lists; else the file and the reason.
    """
    import tensorflow as tf
    index = prefix + ".index"
    if not os.path.exists(index):
        return f"{os.path.basename(index)} is missing"
    if os.path.getsize(index) == 0:
        return f"{os.path.basename(index)} is empty"
    shards = sorted(glob.glob(glob.escape(prefix) + ".data-*-of-*"))
    if not shards:
        return f"{os.path.basename(prefix)}.data-* is missing"
    total = int(_DATA.search(shards[0])[2])
    missing = [f"{os.path.basename(prefix)}.data-{i:05d}-of-{total:05d}" for i in range(total)
               if f"{prefix}.data-{i:05d}-of-{total:05d}" not in shards]
    if missing:
        return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        dtypes, shapes = reader.get_variable_to_dtype_map(), reader.get_variable_to_shape_map()
    except Exception as e:  # noqa: BLE001 - TensorFlow raises several kinds for one unreadable file
        return f"{os.path.basename(index)} cannot be read ({_reason(e)})"
    listed = sum(_numel(shapes[k]) * dtypes[k].size for k in shapes if dtypes[k] != tf.string)
    held = sum(os.path.getsize(s) for s in shards)
    if held < listed:
        names = os.path.basename(shards[0]) if len(shards) == 1 else f"{os.path.basename(prefix)}.data-*"
        return f"{names} holds {held:,} bytes, fewer than the {listed:,} its index lists (cut short)"
    return None


def _reason(e: BaseException) -> str:
    """An exception as a short reason: its type and the first line that says something."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def restore_newest_whole(restore: Callable[[str], None], prefixes: Sequence[str], where: str,
                         say: Callable[[str], None]) -> str:
    """Restore the first checkpoint of `prefixes` that is whole, warning about each damaged one.

    Args:
        restore: restores one prefix into the live objects; an AssertionError from it (the checkpoint does
            not match the model) is raised as it is, any other error marks the checkpoint damaged (a
            checksum TensorFlow finds wrong only while reading).
        prefixes: the candidates, the preferred first (newest first).
        where: the directory, for the error.
        say: where the warnings go.

    Returns:
        The prefix restored.

    Raises:
        TrainError: none of them restores; the message names each and why.
    """
    damaged = []
    for prefix in prefixes:
        why = damage(prefix)
        if why is None:
            try:
                restore(prefix)
                return prefix
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001 - whatever TensorFlow raises for bytes it cannot read
                why = f"restoring it fails: {_reason(e)}"
        damaged.append(f"{os.path.basename(prefix)}: {why}")
        say(f"WARNING: checkpoint {prefix} is damaged ({why}); trying the next older one")
    raise TrainError(f"{where}: no checkpoint restores ({'; '.join(damaged) or 'none found'}); train again into "
                     f"an empty --model-dir")


def remove_temp_saves(directory: str) -> list[str]:
    """Remove the temporary folders of checkpoint saves that were killed (`ckpt-<step>_temp/`).

    Call it only while holding the model dir's writer lock: a live save writes into such a folder.

    Args:
        directory: a CheckpointManager's directory.

    Returns:
        The folders removed.
    """
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), "*_temp")):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
