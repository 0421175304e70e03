"""Where a compiled TensorFlow function's time goes, kernel by kernel: TensorFlow's profiler records every
kernel's run on every executor thread; `profile_kernels` runs the function under it and reads the durations back
from the profile's XSpace file, summed per kernel and divided by the calls. `grouped` sums them into named groups
(a bench's own grouping of scopes and op types).

The figures are kernels' durations summed over threads, not CPU time: two kernels running at once on two
threads both count, so the total can exceed the wall time of a call; a kernel that waits for a busy thread to
run its share of a parallel loop counts the wait; a thread idle between kernels is in no kernel.
"""
from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import Callable

import tensorflow as tf

__all__ = ["profile_kernels", "kernel_ms", "split_name", "grouped"]

_EXECUTOR_LINES = "tf_"  # the executor's threads (tf_Compute/..., tf_numa_..._Eigen/...); not the Python thread


def profile_kernels(fn: Callable[[int], object], calls: int) -> dict[str, float]:
    """Run fn(0) .. fn(calls - 1) under TensorFlow's profiler.

    Args:
        fn: a call of a compiled (already traced) function; its last output is read back so every kernel has run.
        calls: how many calls.

    Returns:
        {kernel name ("scope/op:Type"): ms per call, summed over threads}.

    Raises:
        RuntimeError: the profiler wrote no XSpace file.
    """
    logdir = tempfile.mkdtemp(prefix="recpipe-profile-")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            out = None
            for i in range(calls):
                out = fn(i)
            for t in tf.nest.flatten(out):
                if isinstance(t, tf.Tensor):
                    t.numpy()
        finally:
            tf.profiler.experimental.stop()
        files = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        if not files:
            raise RuntimeError(f"op_profile: the profiler wrote no .xplane.pb under {logdir}")
        return kernel_ms(files[0], calls)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def kernel_ms(path: str, calls: int) -> dict[str, float]:
    """The kernels' durations in one XSpace file (the host plane's executor threads).

    Args:
        path: a `*.xplane.pb` written by TensorFlow's profiler.
        calls: the calls it covers (durations are divided by it).

    Returns:
        {kernel name: ms per call}. Wrapper events (the executor's "ExecutorState::Process", Eigen's
        "ParallelFor", allocations) are left out: their time is that of the kernels inside them.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as fh:
        space.ParseFromString(fh.read())
    out: dict[str, float] = {}
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith(_EXECUTOR_LINES):
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" in name and " " not in name and "::" not in name:
                    out[name] = out.get(name, 0.0) + event.duration_ps / 1e9 / calls
    return out


def split_name(name: str) -> tuple[list[str], str, bool]:
    """A kernel name's parts.

    Args:
        name: "scope/.../op:Type", under "gradient_tape/" for the backward pass.

    Returns:
        (scope components without "gradient_tape", op type, whether it is in the backward pass).
    """
    scope, kind = name.rsplit(":", 1)
    parts = scope.split("/")
    backward = parts[0] == "gradient_tape"
    return (parts[1:] if backward else parts), kind, backward


def grouped(kernels: dict[str, float], group: Callable[[list[str], str, bool], str]) -> dict[str, float]:
    """Kernel times summed by group.

    Args:
        kernels: profile_kernels' dict.
        group: (scope components, op type, backward) -> group name.

    Returns:
        {group: ms per call}, largest first.
    """
    out: dict[str, float] = {}
    for name, ms in kernels.items():
        key = group(*split_name(name))
        out[key] = out.get(key, 0.0) + ms
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
