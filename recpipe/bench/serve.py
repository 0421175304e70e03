"""Serving benchmark: QPS and latency percentiles of `recpipe serve` (REST, single-row requests) at
several concurrencies, batching off and on, against the same SavedModel called in-process.

The servers (batching off, batching on) run in their own processes for the whole bench; the load
comes from this one over keep-alive connections. Every level is measured round-robin with the
in-process calls (repetition by repetition), so ratios between modes compare runs made under the
same machine load. Server and load share this machine's cores.

Where the time goes: around each server level the bench scrapes the server's own Prometheus metrics
(`recpipe_stage_seconds`, recpipe.serving.server.metrics) and reports the mean milliseconds per request of each
stage (read, parse, validate, queue, model, handoff, respond), the server's whole request time, and
the rest of what the client measured (`transport`: HTTP on both sides, the server's event loop
between requests, the client's own threads).
"""
from __future__ import annotations

import glob
import http.client
import json
import os
import shutil
import socket
import threading
import time
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from recpipe.features.canonical import list_separators
from recpipe.features.config import load_config
from recpipe.pipeline.preprocess import run_preprocess
from recpipe.pipeline.synthetic import GenerateSpec, generate_log
from recpipe.bench.common import summary
from recpipe.bench.targets import TARGETS
from recpipe.localserver import free_ports, rest_rows, start_server, stop_server, wait_healthy
from recpipe.serving.export.savedmodel import export_model
from recpipe.serving.server.metrics import STAGES
from recpipe.serving.server.registry import load_version
from recpipe.serving.server.rest import parse_predict_body
from recpipe.serving.version import ExportBase
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.train import train

__all__ = ["bench_serve", "run_serve_bench", "markdown", "scrape_stages", "breakdown"]


def _load(call: Callable[[], None], concurrency: int, seconds: float) -> dict:
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    errors: list[str] = []

    def worker():
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                call()
            except Exception as e:  # noqa: BLE001 - counted and reported, never hidden
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    return {"qps": len(lat) / wall, "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "mean_ms": float(lat.mean()) if len(lat) else float("nan"),
            "requests": int(len(lat)), "errors": len(errors), "first_error": errors[0] if errors else None}


class _KeepAlive:
    """One keep-alive HTTP/1.1 connection sending one pre-encoded request, each response read by its
    Content-Length (the server always sends one). A load generator's own CPU per request is part of
    what a client-side latency measures on a shared box: http.client builds every request anew and
    parses every response's headers through email.parser, several times this."""

    def __init__(self, port: int, request: bytes):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request, self.buf = request, b""

    def call(self) -> int:
        """Send the request once and read its whole response: the HTTP status."""
        self.sock.sendall(self.request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._recv()
        head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:]
        status = int(head.split(" ", 2)[1])
        length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")[1:]
                       if line.lower().startswith("content-length:")), None)
        if length is None:
            raise RuntimeError(f"HTTP {status} without Content-Length: {head!r}")
        while len(self.buf) < length:
            self._recv()
        self.buf = self.buf[length:]
        return status

    def _recv(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _http_caller(port: int, path: str, body: bytes) -> Callable[[], None]:
    """A POST of `body` to `path` per call, over a keep-alive connection per load thread."""
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    local = threading.local()

    def call():
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = _KeepAlive(port, request)
        try:
            status = conn.call()
        except (OSError, RuntimeError, ValueError):  # ValueError: a status or length that is not a number
            conn.close()
            local.conn = None  # reconnect next time; the failure is counted by the caller
            raise
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
    return call


def scrape_stages(port: int) -> dict[str, tuple[float, float]]:
    """(sum seconds, count) of each stage and of the whole rest_predict request, from the server's metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/monitoring/prometheus/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("recpipe_stage_seconds_sum", "recpipe_stage_seconds_count"):
                key = sample.labels["stage"]
            elif sample.name in ("recpipe_request_latency_seconds_sum", "recpipe_request_latency_seconds_count") \
                    and sample.labels.get("api") == "rest_predict":
                key = "server"
            else:
                continue
            out.setdefault(key, [0.0, 0.0])[0 if sample.name.endswith("_sum") else 1] = sample.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def breakdown(before: dict, after: dict, client_mean_ms: float) -> dict:
    """Mean ms per request of each stage between two scrapes (per request of the level: a stage a request
    skips counts 0), the server's whole request, and `transport`: the client's mean latency minus it."""
    requests = after["server"][1] - before.get("server", (0.0, 0.0))[1]
    if requests <= 0:
        return {}
    ms = {k: (after.get(k, (0.0, 0.0))[0] - before.get(k, (0.0, 0.0))[0]) / requests * 1000
          for k in (*STAGES, "server")}
    ms["other_in_server"] = ms["server"] - sum(ms[s] for s in STAGES)
    ms["transport"] = client_mean_ms - ms["server"]
    ms["client"] = client_mean_ms
    return ms


def _median_run(runs: list[dict]) -> dict:
    """The median run by QPS, with the min/median/max of QPS and p99 over the runs."""
    ordered = sorted(runs, key=lambda r: r["qps"])
    return {**ordered[len(ordered) // 2], "qps_reps": summary([r["qps"] for r in ordered]),
            "p99_ms_reps": summary([r["p99_ms"] for r in ordered])}


SERVER_MODES = {"batching_off": [], "batching_on": ["--max-batch-rows", "64", "--batch-timeout-ms"]}


def bench_serve(export_base: str, model_name: str, rows: list[dict], say: Callable[[str], None],
                concurrencies=(1, 8, 32), seconds: float = 4.0, batch_timeout_ms: float = 0.0, reps: int = 3) -> dict:
    """QPS and latency percentiles per mode and concurrency. Both servers run for the whole bench and
    the levels are measured round-robin (each repetition: every concurrency, every mode, in-process
    included), so a ratio between modes compares runs made under the same machine load; each level
    is reported as its median repetition by QPS, with the min/median/max of QPS and p99."""
    newest = ExportBase(export_base).versions()[-1]
    lv = load_version(newest.path, newest.version)
    one = [parse_predict_body({"instances": [r]}, lv.inputs, lv.list_inputs)[0] for r in rows]
    tensors = [{k: tf.constant(v, dtype=lv.inputs[k].dtype) for k, v in c.items()} for c in one]
    counter = iter(range(10**12))
    body = json.dumps({"instances": [rows[0]]}).encode()
    servers: dict[str, tuple] = {}
    try:
        ports = iter(free_ports(2 * len(SERVER_MODES)))  # all at once: none starts on another's port
        for mode, extra in SERVER_MODES.items():
            port, grpc_port = next(ports), next(ports)
            args = [*extra, str(batch_timeout_ms)] if extra else []
            servers[mode] = (port, start_server(export_base, model_name, port, grpc_port, *args, quiet=True))
        for port, proc in servers.values():
            wait_healthy(port, proc)
        calls = {"in_process": lambda: lv.fn(**tensors[next(counter) % len(tensors)]),
                 **{mode: _http_caller(port, f"/v1/models/{model_name}:predict", body)
                    for mode, (port, _) in servers.items()}}
        runs: dict = {mode: {c: [] for c in concurrencies} for mode in calls}
        stages: dict = {mode: {c: {} for c in concurrencies} for mode in servers}
        for rep in range(reps):
            for c in concurrencies:
                say(f"bench serve: repetition {rep + 1}/{reps}, concurrency {c}")
                for mode, call in calls.items():
                    _load(call, c, min(0.5, seconds / 2))  # warm up the level's threads and connections
                    before = scrape_stages(servers[mode][0]) if mode in servers else None
                    runs[mode][c].append(_load(call, c, seconds))
                    if before is not None:
                        _add_stages(stages[mode][c], before, scrape_stages(servers[mode][0]))
    finally:
        for _, proc in servers.values():
            stop_server(proc, timeout=30)
    results: dict = {mode: {str(c): _median_run(runs[mode][c]) for c in concurrencies} for mode in calls}
    for mode in servers:
        for c in concurrencies:
            done = runs[mode][c]
            client_ms = sum(r["mean_ms"] * r["requests"] for r in done) / max(sum(r["requests"] for r in done), 1)
            results[mode][str(c)]["breakdown_ms"] = breakdown({}, stages[mode][c], client_ms)
    results["settings"] = {"max_batch_rows": 64, "batch_timeout_ms": batch_timeout_ms, "seconds_per_level": seconds,
                           "request_rows": 1, "reps": reps, "order": "round-robin: repetition, concurrency, mode"}
    best8 = max(results["batching_off"]["8"]["qps"], results["batching_on"]["8"]["qps"])
    results["ratios"] = {"serve_qps_vs_inprocess": best8 / results["in_process"]["8"]["qps"],
                         "serve_p99_ms_c8": min(results["batching_off"]["8"]["p99_ms"],
                                                results["batching_on"]["8"]["p99_ms"])}
    return results


def _add_stages(total: dict, before: dict, after: dict) -> None:
    """Add the (seconds, count) each stage gained between two scrapes to `total`."""
    for key, (sec, count) in after.items():
        was = before.get(key, (0.0, 0.0))
        have = total.get(key, (0.0, 0.0))
        total[key] = (have[0] + sec - was[0], have[1] + count - was[1])


def markdown(results: dict) -> str:
    st = results["settings"]
    lines = [f"# Serving benchmark (REST, one row per request; server and load share {os.cpu_count()} cores; "
             f"median of {st.get('reps', 1)} runs per level)", "",
             f"batching_on: --max-batch-rows {st['max_batch_rows']} --batch-timeout-ms {st['batch_timeout_ms']:g}; "
             f"{st['seconds_per_level']:g} s per level.", "",
             "| mode | concurrency | QPS | QPS min–max | p50 ms | p99 ms | p99 min–max | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in ("in_process", "batching_off", "batching_on"):
        for c, r in sorted(results[mode].items(), key=lambda kv: int(kv[0])):  # JSON keys sort as text
            q, p = r.get("qps_reps", {"min": r["qps"], "max": r["qps"]}), r.get("p99_ms_reps", {"min": r["p99_ms"],
                                                                                                 "max": r["p99_ms"]})
            lines.append(f"| {mode} | {c} | {r['qps']:,.0f} | {q['min']:,.0f}–{q['max']:,.0f} | {r['p50_ms']:.2f} | "
                         f"{r['p99_ms']:.2f} | {p['min']:.2f}–{p['max']:.2f} | {r['errors']} |")
    lines += ["", "Where a request's time goes (mean ms per request over the level's runs, from the server's "
              "`recpipe_stage_seconds`; transport = the client's mean latency − the server's request time):", "",
              "| mode | concurrency | client | transport | server | " + " | ".join(STAGES) + " | other |",
              "|---|---|---|---|---|" + "---|" * (len(STAGES) + 1)]
    for mode in ("batching_off", "batching_on"):
        for c, r in sorted(results[mode].items(), key=lambda kv: int(kv[0])):  # JSON keys sort as text
            b = r.get("breakdown_ms")
            if b:
                lines.append(f"| {mode} | {c} | {b['client']:.2f} | {b['transport']:.2f} | {b['server']:.2f} | "
                             + " | ".join(f"{b[s]:.2f}" for s in STAGES) + f" | {b['other_in_server']:.2f} |")
    r = results["ratios"]
    (qps_op, qps_target), (p99_op, p99_target) = TARGETS["serve_qps_vs_inprocess"], TARGETS["serve_p99_ms_c8"]
    lines += ["", f"- **serve_qps_vs_inprocess** (concurrency 8, best mode): **{r['serve_qps_vs_inprocess']:.2f}** "
              f"(target {qps_op} {qps_target:g})",
              f"- **serve_p99_ms_c8**: **{r['serve_p99_ms_c8']:.2f} ms** (target {p99_op} {p99_target:g})", "",
              "Reproduce: `.venv/bin/recpipe bench serve`.", ""]
    return "\n".join(lines)


def run_serve_bench(work: str, cfg_path: str, rows: int, steps: int, reps: int, seconds: float,
                    say: Callable[[str], None], data: Optional[tuple[str, str]] = None,
                    concurrencies: tuple[int, ...] = (1, 8, 32)) -> dict:
    """Train `steps` on `data` = (raw log dir, its preprocessed dir) or on a generated log of `rows`,
    export version 1, then bench_serve it with raw rows of the log's last file."""
    cfg = load_config(cfg_path)
    if data is None:
        log, pre = os.path.join(work, "log"), os.path.join(work, "pre")
        generate_log(GenerateSpec(rows=rows, days=2, seed=11), log)
        run_preprocess(cfg, log, pre, say=say)
    else:
        log, pre = data
    model, export = os.path.join(work, "model"), os.path.join(work, "export")
    for done in (model, export):  # a rerun in the same workdir trains and exports afresh
        shutil.rmtree(done, ignore_errors=True)
    train(TrainOptions(pre, model, cfg_path, run=RunOptions(steps=steps)), say=say)
    export_model(model, export, version=1)
    columns = sorted({f.column for f in [*cfg.column_sparse, *cfg.features.dense]})
    request_rows, _ = rest_rows(sorted(glob.glob(os.path.join(log, "*", "*.parquet")))[-1], columns, 64,
                                separators=list_separators(cfg))
    return bench_serve(export, cfg.name, request_rows, say, concurrencies=concurrencies,
                       seconds=seconds, reps=reps)
