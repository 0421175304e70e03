"""`python -m recpipe.bench.measure OUT_JSON CMD...`: run CMD, then write {"returncode", "peak_rss_mb"} of it.

Why a separate small process: Linux carries a process's resident-set high-water mark across
fork + exec (the forked copy of the parent's memory counts), so a child forked straight from a
big benchmark process reports the parent's RSS as its own peak. Forked from this small process,
CMD's ru_maxrss is its own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    out, cmd = argv[0], argv[1:]
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    with open(out, "w") as fh:
        json.dump({"returncode": rc, "peak_rss_mb": usage.ru_maxrss / 1024.0}, fh)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
