"""Allocator choice for `recpipe train` (train.tuning.allocator or --allocator): the process
re-executes itself once with tcmalloc or jemalloc in LD_PRELOAD, which every task it starts (PS
workers, Horovod ranks) inherits. `auto` (the default) is tcmalloc when its library is installed,
else the system allocator. No TensorFlow import here: this runs before it."""
from __future__ import annotations

import os
import sys
from typing import Callable

from recpipe.common.errors import RecpipeError

__all__ = ["AllocatorError", "ALLOCATORS", "AUTO", "find_library", "loaded_allocator", "reexec_with", "resolve"]

ALLOCATORS = {  # name -> (shared objects to look for, Debian package)
    "tcmalloc": (("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "libtcmalloc-minimal4"),
    "jemalloc": (("libjemalloc.so.2",), "libjemalloc2"),
}
_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
_MARK = "RECPIPE_ALLOCATOR_REEXEC"
AUTO = "tcmalloc"  # what `auto` prefers: the default DCN-v2 trains 1.07x faster with it (README)


class AllocatorError(RecpipeError, RuntimeError):
    pass


def find_library(name: str) -> str:
    if name not in ALLOCATORS:
        raise AllocatorError(f"allocator {name!r}: use system, {', '.join(ALLOCATORS)}")
    sonames, package = ALLOCATORS[name]
    for d in _DIRS:
        for so in sonames:
            if os.path.exists(os.path.join(d, so)):
                return os.path.join(d, so)
    raise AllocatorError(f"allocator {name}: none of {', '.join(sonames)} found in {', '.join(_DIRS)}; "
                         f"install it (apt-get install {package}) or set train.tuning.allocator: system")


def loaded_allocator() -> str:
    """The allocator mapped into this process: tcmalloc, jemalloc or system."""
    try:
        with open("/proc/self/maps") as fh:
            maps = fh.read()
    except OSError:
        return "system"
    return next((n for n, (sonames, _) in ALLOCATORS.items() if any(so.split(".so")[0] in maps for so in sonames)),
                "system")


def resolve(name: str) -> tuple[str, str]:
    """(the allocator `name` stands for, why): `auto` is tcmalloc when its library is installed, an
    allocator already preloaded by the caller, or else system; any other name is itself."""
    if name != "auto":
        return name, "configured"
    loaded = loaded_allocator()
    if loaded != "system":
        return loaded, "auto: already preloaded"
    try:
        find_library(AUTO)
    except AllocatorError as e:
        return "system", f"auto: {e}"
    return AUTO, "auto"


def reexec_with(name: str, argv: list[str], say: Callable[[str], None]) -> None:
    """Make sure this process runs with allocator `name` (or what `auto` resolves to): return if it
    already does (or it is system), else exec `python -m recpipe.cli ARGV` with the library
    preloaded (does not return)."""
    name, why = resolve(name)
    if name == "system" and why != "configured":
        say(f"train: allocator system ({why})")
    if name == "system" or loaded_allocator() == name:
        return
    path = find_library(name)
    if os.environ.get(_MARK) == name:
        raise AllocatorError(f"allocator {name}: preloaded {path} but it is not mapped into the process")
    preload = " ".join(p for p in (path, os.environ.get("LD_PRELOAD", "")) if p)
    say(f"train: allocator {name} ({path}) via LD_PRELOAD")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "recpipe.cli", *argv],
              dict(os.environ, LD_PRELOAD=preload, **{_MARK: name}))
