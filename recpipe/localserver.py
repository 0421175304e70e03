"""A `recpipe serve` process on this host, and a client's side of it: ports, start, readiness,
raw log rows as TF Serving 'instances'. Used by the demo, the serving benchmark and the tests."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Mapping

import pyarrow.parquet as pq

from recpipe.common.ports import free_ports
from recpipe.features.canonical import DEFAULT_SEPARATOR

__all__ = ["free_port", "free_ports", "start_server", "wait_healthy", "stop_server", "post_json", "rest_rows"]


def free_port() -> int:
    return free_ports(1)[0]


def start_server(export_base: str, model_name: str, rest_port: int, grpc_port: int, *extra: str,
                 quiet: bool = False) -> subprocess.Popen:
    """`recpipe serve` in its own process on 127.0.0.1 (output piped, or discarded when quiet)."""
    out = subprocess.DEVNULL if quiet else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "recpipe.cli", "serve", "--export-base", export_base,
                             "--model-name", model_name, "--rest-port", str(rest_port), "--grpc-port", str(grpc_port),
                             *extra], stdout=out, stderr=subprocess.STDOUT if not quiet else subprocess.DEVNULL,
                            text=True)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120.0, poll_s: float = 0.5) -> None:
    """Block until the model server in `proc` answers /healthz on 127.0.0.1:port (asked every poll_s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"model server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(poll_s)
    raise TimeoutError(f"model server not healthy on port {port} after {timeout:.0f}s")


def stop_server(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def post_json(url: str, body: dict, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def rest_rows(parquet_path: str, columns: list[str], n: int, from_end: bool = True,
              separators: Mapping[str, str] | None = None) -> tuple[list[dict], list[int]]:
    """n raw rows of a log file as TF Serving 'instances' and their labels.

    Args:
        parquet_path: the log file.
        columns: the columns to send.
        n: how many rows.
        from_end: the last n rows (else the first).
        separators: {column: separator} (recpipe.features.canonical.list_separators(cfg)): a list is joined
            by its column's, else by DEFAULT_SEPARATOR (a feature without `separator`).

    Returns:
        (instances without the null values, labels).
    """
    pf = pq.ParquetFile(parquet_path)
    table = pf.read(columns=[*columns, "label"]) if "label" not in columns else pf.read(columns=columns)
    table = table.slice(max(table.num_rows - n, 0) if from_end else 0, n)
    rows = []
    for r in table.to_pylist():
        inst = {}
        for c in columns:
            v = r[c]
            if isinstance(v, list):
                v = (separators or {}).get(c, DEFAULT_SEPARATOR).join("" if x is None else str(x) for x in v)
            if v is not None:
                inst[c] = v
        rows.append(inst)
    return rows, [int(x) for x in table.column("label").to_pylist()]
