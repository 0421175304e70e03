"""How much memory a new allocation of this process can still get: the smaller of the host's MemAvailable
and the headroom of the process's memory cgroup (v1 or v2; the tightest limit up its hierarchy, as a
container's limit is; inactive page cache not counted as used, as the kernel reclaims it before an OOM
kill). Read by the trainer before it builds the embedding tables (recpipe.trainers.memory) and by the model
server before it loads a version (recpipe.serving.server.registry), so neither is killed for memory without a word.
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["GIB", "available_memory"]

GIB = float(1 << 30)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _cgroup_headroom(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> Optional[tuple[int, str]]:
    """(bytes the process's memory cgroup and its ancestors still allow, which one), or None without a limit."""
    text = _read(proc) or ""
    best: Optional[tuple[int, str]] = None
    for line in text.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            base, limit_f, usage_f, inactive = os.path.join(root), "memory.max", "memory.current", "inactive_file"
            if not os.path.exists(os.path.join(root, "memory.max")) and os.path.isdir(os.path.join(root, "unified")):
                base = os.path.join(root, "unified")
        elif "memory" in controllers.split(","):
            base, limit_f, usage_f, inactive = (os.path.join(root, "memory"), "memory.limit_in_bytes",
                                                "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            d = os.path.join(base, *parts[:depth])
            limit, usage = _read(os.path.join(d, limit_f)), _read(os.path.join(d, usage_f))
            if not limit or not usage or limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
                continue
            stat = dict(ln.split() for ln in (_read(os.path.join(d, "memory.stat")) or "").splitlines()
                        if len(ln.split()) == 2)
            used = int(usage) - int(stat.get(inactive, 0))  # inactive page cache is reclaimed before OOM
            room = (max(int(limit) - used, 0), f"memory cgroup {d} (limit {int(limit) / GIB:.1f} GiB)")
            if best is None or room[0] < best[0]:
                best = room
    return best


def available_memory() -> tuple[int, str]:
    """(bytes a new allocation can still get, where that figure comes from)."""
    meminfo = dict(ln.split(":", 1) for ln in (_read("/proc/meminfo") or "").splitlines() if ":" in ln)
    avail = meminfo.get("MemAvailable", "").split()
    out = (int(avail[0]) * 1024, "the host's MemAvailable") if avail and avail[0].isdigit() else None
    cgroup = _cgroup_headroom()
    if cgroup is not None and (out is None or cgroup[0] < out[0]):
        out = cgroup
    return out if out is not None else (1 << 62, "unknown (no /proc/meminfo)")
