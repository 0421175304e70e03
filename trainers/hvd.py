"""Horovod ring-allreduce training (Gloo on CPU): a custom loop on horovod.tensorflow.

Launchers: `recpipe train --strategy horovod --np N` re-runs itself under `horovodrun -np N --gloo`
on this host. Across hosts without ssh, every host runs `recpipe train --strategy horovod --hosts
H1[:S],H2[:S] --host-index I`: the first host also runs Horovod's rendezvous server, and each host
starts its S ranks with the environment horovodrun would give them (the Gloo interface is the one
holding the host's address). Where ssh exists, `horovodrun -H ... recpipe train --strategy horovod`
works too. Each rank
reads its own part of the shards (InputContext), uses `batch_size` rows per step (the effective
batch is N x batch_size, as in Horovod's examples), and averages gradients with
Horovod's collectives, in train.gradient_groups grouped ones per step; initial state is
broadcast from rank 0, and at the end every rank's weights are checked equal. Sparse embedding
gradients are allgathered as IndexedSlices or densified and allreduced (train.sparse_gradients). Horovod's
background thread cycles every train.horovod_cycle_time_ms (HOROVOD_CYCLE_TIME, when set, wins). Only rank 0
writes checkpoints, TensorBoard events, train_state.json and the progress events the launcher shows.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Callable, Optional

import tensorflow as tf

from features.artifact import TransformArtifact, summary_differences
from features.code_identity import code_identity, identity_differences
from features.config import Config, config_to_dict
from features.errors import RecpipeError
from features.preprocessed import PreprocessedData
from trainers.advisor import allreduces_table
from trainers.allocator import loaded_allocator
from trainers.data import make_dataset, synthetic_dataset
from trainers.errors import TrainError, how_it_ended
from trainers.gradients import accumulated_gradients
from trainers.health import check_loss
from trainers.model_dir import ModelDir, TrainState
from trainers.models import compiled_model
from trainers.optim import optimizer_for, precision_policy
from trainers.options import RunOptions, TrainOptions, host_list, run_flags
from trainers.progress import EVENTS_ENV, Reporter, follow_events
from trainers.validation import validator_for
from trainers.warm_start import apply_warm_start

__all__ = ["inside_horovod_job", "train_horovod", "launch", "run_rank", "horovodrun", "horovod_cycle_time_ms"]


def inside_horovod_job() -> bool:
    return "HOROVOD_RANK" in os.environ


def train_horovod(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int,
                  say: Callable[[str], None]) -> TrainState:
    """Run this process as a rank (inside a job, or alone with --np 1), else launch the ranks."""
    if inside_horovod_job():
        return run_rank(cfg, artifact, opts, total, say)
    if opts.run.hosts:
        return launch_on_host(opts, total, say)
    if opts.run.np == 1:  # one rank needs no launcher: hvd.init() alone gives size 1
        return run_rank(cfg, artifact, opts, total, say)
    return launch(opts, say)


def horovodrun() -> str:
    """The horovodrun of this environment, when Horovod is built for this TensorFlow; else a TrainError."""
    found = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    try:
        importlib.import_module("horovod.tensorflow")  # built for this TensorFlow?
    except ImportError:
        found = None
    if not found:
        raise TrainError("--strategy horovod needs Horovod built for this TensorFlow: run `make horovod` "
                         "(builds 0.28.1 from source, about 10 minutes once, then cached)")
    return found


def _rank_command(opts: TrainOptions) -> list[str]:
    """What every rank runs: this `recpipe train` with the config this launcher resolved."""
    cmd = [sys.executable, "-m", "recpipe.cli", "train", "--data", opts.data_dir, "--model-dir", opts.model_dir,
           "--config", ModelDir(opts.model_dir).config_path, *run_flags(opts.run), "--strategy", "horovod"]
    return (cmd + (["--warm-start", opts.warm_start] if opts.warm_start else [])
            + (["--synthetic-input"] if opts.synthetic_input else []))


def _supervise(start: Callable[[dict], list[subprocess.Popen]], say: Callable[[str], None]) -> list[tuple]:
    """Start rank processes (start(extra_env) -> processes), show rank 0's progress events, wait for all;
    when one fails, stop the others. Returns (returncode, last output lines, order of failure) per
    process (order 0: the first to fail; None: it did not fail first-hand)."""
    with tempfile.TemporaryDirectory(prefix="recpipe-hvd-") as tmp:
        events = os.path.join(tmp, "events.jsonl")
        reporter = Reporter(say, 0, 0, 0)
        done = threading.Event()
        follower = threading.Thread(target=follow_events, args=(events, _replay(reporter), done), daemon=True)
        follower.start()
        procs = start({"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"), EVENTS_ENV: events})
        tails: list[list[str]] = [[] for _ in procs]

        def drain(i: int, proc: subprocess.Popen) -> None:
            for line in proc.stdout:  # kept for error messages only (the last lines, the first line naming a
                raw = line.rstrip("\n")  # dead rank, each rank's last failure line, with its "[rank]<stderr>:"
                old = tails[i]            # prefix); progress comes as events
                tails[i] = ([t for t in old if _DIED.search(t)][:1] + _last_failures(old)
                            + [t for t in old if not _DIED.search(t) and not _failure(t)][-19:]
                            + [raw if _failure(raw) else raw.split(">:", 1)[-1]])

        readers = [threading.Thread(target=drain, args=(i, p), daemon=True) for i, p in enumerate(procs)]
        for r in readers:
            r.start()
        failed: list[int] = []
        while any(p.poll() is None for p in procs):
            for i, p in enumerate(procs):
                if p.poll() not in (None, 0) and i not in failed:
                    failed.append(i)
            if failed:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            done.wait(0.2)
        failed += [i for i, p in enumerate(procs) if p.returncode not in (0, None) and i not in failed]
        for r in readers:
            r.join(timeout=5)
        done.set()
        follower.join()
        reporter.close()
    return [(p.returncode, t, failed.index(i) if i in failed else None) for i, (p, t) in enumerate(zip(procs, tails))]


_DIED = re.compile(r"Process (\d+) exit with status code (-?\d+)")


# what a rank prints when it fails: the CLI's "recpipe train: error: ...", or a traceback's last line;
# under horovodrun each line starts with "[rank]<stdout>:" or "[rank]<stderr>:"
_RANK_PREFIX = re.compile(r"^\[(\d+)\]<std(?:out|err)>:")
_CLI_ERROR = re.compile(r"^\s*recpipe [\w-]+: error: (.+)")
_RAISED = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception): .+)")  # module path dropped


# Gloo's rendezvous giving up on ranks that never registered (then std::terminate: SIGABRT, no traceback)
_NEVER_JOINED = re.compile(r"Wait timeout after (\d+) seconds for key\(s\): ([\d ,]+)")
NEVER_JOINED = "which never joined"  # in _failure's message for such a line


def _failure(line: str) -> tuple[Optional[int], str] | None:
    """(rank or None when the line has no horovodrun prefix, message) of a failure line a rank printed;
    None for any other line, horovodrun's own 'one or more processes exited' included."""
    prefix = _RANK_PREFIX.match(line)
    rest = line[prefix.end():] if prefix else line
    joined = _NEVER_JOINED.search(rest)
    if joined:
        ranks = ", ".join(re.findall(r"\d+", joined[2]))
        return (int(prefix[1]) if prefix else None), (f"Gloo's rendezvous waited {joined[1]} s for rank(s) {ranks}, "
                                                      f"{NEVER_JOINED} (HOROVOD_GLOO_TIMEOUT_SECONDS)")
    m = _CLI_ERROR.match(rest) or _RAISED.match(rest)
    if m is None or "one or more processes exited" in line:
        return None
    return (int(prefix[1]) if prefix else None), m[1].strip()


def _last_failures(lines: list[str]) -> list[str]:
    """Each rank's last failure line."""
    last = {}
    for line in lines:
        found = _failure(line)
        if found:
            last[found[0]] = line
    return list(last.values())


def rank_died(opts: TrainOptions, rank: int, code: int, where: str = "", output: list[str] = (),
              host_of: Optional[dict[int, tuple[int, str]]] = None) -> TrainError:
    """output: the last lines of the rank's own process, or of horovodrun's (then each prefixed by its
    rank): the rank's last failure line there, if any, is given as the cause. Another rank's error
    (e.g. a collective failing because this rank was killed) is not. host_of: rank -> (host index, host)
    of a job over --hosts, to say where ranks that never joined should have started."""
    causes = [f[1] for f in map(_failure, output) if f is not None and f[0] in (None, rank)]
    hint = ""
    joined = next((m for m in map(_NEVER_JOINED.search, output) if m), None)
    if joined and causes and NEVER_JOINED in causes[-1] and host_of:
        missing = sorted({host_of[int(r)] for r in re.findall(r"\d+", joined[2]) if int(r) in host_of})
        hint = "".join(f"; is `recpipe train ... --host-index {i}` running on {h}, or did it stop before starting its "
                       f"ranks (its own output says why)?" for i, h in missing[:3])
    return ModelDir(opts.model_dir).stopped(f"horovod rank {rank}{where} died ({how_it_ended(code)}"
                                            f"{': ' + causes[-1] if causes else ''}{hint})")


def launch(opts: TrainOptions, say: Callable[[str], None]) -> TrainState:
    """Run `recpipe train --strategy horovod` as opts.run.np ranks on this host; raise if any rank fails.
    Rank 0's progress reaches this process as JSON events (trainers.progress), shown as its lines."""
    run = opts.run
    cmd = [horovodrun(), "-np", str(run.np), "-H", f"localhost:{run.np}", "--gloo", *_rank_command(opts)]
    say(f"train: horovodrun -np {run.np} --gloo on localhost")
    (rc, tail, _), = _supervise(lambda env: [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                              text=True, env=dict(os.environ, **env))], say)
    if rc != 0:
        died = next((m for m in map(_DIED.search, tail) if m), None)  # horovodrun names the first rank to fail
        if died:
            raise rank_died(opts, int(died[1]), int(died[2]), output=tail)
        raise TrainError(f"horovodrun exited with {rc}: " + " | ".join(t for t in tail if t)[-800:])
    return _written_state(opts)


def _written_state(opts: TrainOptions) -> TrainState:
    state = ModelDir(opts.model_dir).state()
    if state is None:
        raise TrainError(f"{opts.model_dir}: the ranks finished but rank 0 wrote no train_state.json")
    return state


def launch_on_host(opts: TrainOptions, total: int, say: Callable[[str], None]) -> TrainState:
    """This host's part of a job over --hosts (no ssh): the rendezvous server if this is the first host,
    and this host's ranks with the environment horovodrun would set."""
    run = opts.run
    horovodrun()  # Horovod built for this TensorFlow, or a clear error
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    hosts = parse_hosts(",".join(f"{h}:{n}" for h, n in host_list(run.hosts)))
    plan = get_host_assignments(hosts, sum(h.slots for h in hosts))
    me = hosts[run.host_index].hostname
    first = _address(hosts[0].hostname)
    iface = interface_of(_address(me))
    mine = [slot for slot in plan if slot.hostname == me]
    server = _start_rendezvous(run.rendezvous_port, plan) if run.host_index == 0 else None
    say(f"train: horovod host {run.host_index} ({me}, {iface}): ranks {[s.rank for s in mine]} of {len(plan)}; "
        f"rendezvous {first}:{run.rendezvous_port}")

    procs: list[subprocess.Popen] = []

    def start(env: dict) -> list[subprocess.Popen]:
        _RANKS_STARTED.set()
        procs.extend(subprocess.Popen(_rank_command(opts), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=dict(os.environ, **env,
                                                          **slot_env(slot, first, run.rendezvous_port, iface)))
                     for slot in mine)
        return procs

    index = {h.hostname: i for i, h in enumerate(hosts)}
    done = threading.Event()
    if server is not None:
        threading.Thread(target=_watch_rendezvous, args=(server, plan, index, say, done), daemon=True).start()
    stopped: list[dict] = []  # what a host that stopped before starting its ranks told the rendezvous store
    read = ((lambda: _stored(server, *_STOPPED_KEY)) if server is not None
            else functools.partial(_fetch, first, run.rendezvous_port, *_STOPPED_KEY))
    threading.Thread(target=_watch_for_stopped_host, args=(read, procs, stopped, done), daemon=True).start()
    try:
        results = _supervise(start, say)
    finally:
        done.set()
        if server is not None:
            if stopped:  # the other hosts read the report from this store: it serves until they have looked
                time.sleep(2 * _STOPPED_POLL_SECONDS)
            server.shutdown()
    if not stopped and any(rc != 0 for rc, _, _ in results):  # one last look: a rank of this host may have
        raw = read()                                           # failed before the watcher saw a host stop
        if raw is not None:
            stopped.append(_stopped_report(raw))
    if stopped:
        host = stopped[0]
        raise ModelDir(opts.model_dir).stopped(f"host {host.get('index')} ({host.get('host')}) stopped before "
                                               f"starting its ranks: {host.get('error')}")
    failed = sorted((order, slot.rank, rc, tail) for slot, (rc, tail, order) in zip(mine, results)
                    if order is not None)
    if failed:
        _, rank, rc, tail = failed[0]
        host_of = {slot.rank: (index[slot.hostname], slot.hostname) for slot in plan}
        raise rank_died(opts, rank, rc, f" on {me}", tail, host_of)
    if any(slot.rank == 0 for slot in mine):
        return _written_state(opts)
    say(f"train: ranks on {me} finished; rank 0 on {hosts[0].hostname} wrote the model dir")
    shared = ModelDir(opts.model_dir).state()  # readable here when the model dir is on shared storage
    return shared or TrainState(total, 0, 0, 0.0, 0.0, math.nan, "horovod", run.precision, 0, ranks=len(plan))


def slot_env(slot, rendezvous_addr: str, rendezvous_port: int, iface: str) -> dict[str, str]:
    """The environment horovodrun --gloo gives one rank (horovod.runner.gloo_run)."""
    return {"HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface,
            "HOROVOD_GLOO_TIMEOUT_SECONDS": os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "300")}


def _address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise TrainError(f"--hosts: cannot resolve {host!r} ({e})") from None


def interface_of(address: str) -> str:
    """The network interface holding IPv4 `address` on this machine (Gloo's device binds to it)."""
    import psutil  # Horovod's own dependency
    found = {name: [a.address for a in addrs if a.family == socket.AF_INET]
             for name, addrs in psutil.net_if_addrs().items()}
    for name, addrs in found.items():
        if address in addrs:
            return name
    raise TrainError(f"--hosts: {address} is not an address of this machine ({found}); check --host-index")


_RANK_KEY = re.compile(r"(?:rank_)?(\d+)")  # a rank's keys in the rendezvous store's "global" scope


def _watch_rendezvous(server, plan: list, index: dict[str, int], say: Callable[[str], None], done: threading.Event,
                      after: float = 5.0, every: float = 30.0) -> None:
    """On the first host: once a rank has joined Gloo's rendezvous (its keys in `server`'s store), say which
    ranks have not, `after` seconds on and then every `every` seconds, until all have or `done` is set. Gloo
    itself waits (HOROVOD_GLOO_TIMEOUT_SECONDS) without a word, then aborts every rank that joined."""
    first_join = said = None
    while not done.wait(1.0):
        with server.cache_lock:
            keys = list(server.cache.get("global", {}))
        joined = {int(m[1]) for m in map(_RANK_KEY.fullmatch, keys) if m}
        missing = [slot for slot in plan if slot.rank not in joined]
        if not missing:
            return
        now = time.monotonic()
        first_join = first_join if first_join is not None or not joined else now
        if first_join is None or now - first_join < after or (said is not None and now - said < every):
            continue
        named = ", ".join(f"rank {slot.rank} (host {index[slot.hostname]}, {slot.hostname})" for slot in missing[:6])
        say(f"train: waiting for {named}{' and more' if len(missing) > 6 else ''} to join Gloo's rendezvous "
            f"({now - first_join:.0f} s since rank {min(joined)} joined): is `recpipe train ... --host-index N` "
            f"running there?")
        said = now


# Where a host of a job over --hosts that stops before starting its ranks says why: a key of the first host's
# rendezvous store (Horovod's HTTP key-value server; Gloo's own keys are in the "global" scope).
_STOPPED_KEY = ("recpipe", "host_stopped")
_RANKS_STARTED = threading.Event()  # set once this launcher has started its ranks
_STOPPED_POLL_SECONDS = 2.0  # how often every host's launcher looks for such a report


@contextlib.contextmanager
def telling_the_job_if_this_host_stops(run: RunOptions, say: Callable[[str], None]):
    """Around a host's `recpipe train --hosts ...` (not the first host's, which serves the rendezvous): if it
    fails before it starts its ranks (a missing or other copy of the data, a bad config, memory), its error
    goes to the first host's rendezvous store, where every other host's launcher looks, so the job stops at
    once naming it. Before, their ranks waited in Gloo's rendezvous for ranks that would never come
    (HOROVOD_GLOO_TIMEOUT_SECONDS, 300 s) and died by SIGABRT, naming no cause."""
    if run.strategy != "horovod" or not run.hosts or run.host_index == 0 or inside_horovod_job():
        yield
        return
    try:
        yield
    except BaseException as e:
        if not _RANKS_STARTED.is_set() and not isinstance(e, KeyboardInterrupt):
            hosts = host_list(run.hosts)
            text = str(e) if isinstance(e, RecpipeError) else f"{type(e).__name__}: {e}"
            body = json.dumps({"index": run.host_index, "host": hosts[run.host_index][0], "error": text})
            _tell(hosts[0][0], run.rendezvous_port, body.encode(), say)
        raise


def _tell(first: str, port: int, body: bytes, say: Callable[[str], None], wait: float = 30.0) -> None:
    """PUT `body` at _STOPPED_KEY in the first host's rendezvous store, retrying for `wait` seconds while it
    does not serve yet (hosts start at different times)."""
    url = f"http://{first}:{port}/{'/'.join(_STOPPED_KEY)}"
    deadline = time.monotonic() + wait
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=3).close()
            say(f"train: told the first host's rendezvous ({first}:{port}) that this host stopped")
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                say(f"train: could not tell the first host's rendezvous ({first}:{port}) that this host stopped "
                    f"({e}); its ranks wait for this host's until HOROVOD_GLOO_TIMEOUT_SECONDS")
                return
            time.sleep(1.0)


def _stored(server, scope: str, key: str) -> Optional[bytes]:
    with server.cache_lock:
        return server.cache.get(scope, {}).get(key)


def _fetch(first: str, port: int, scope: str, key: str) -> Optional[bytes]:
    """A key of the first host's rendezvous store, None while it is not set (or the store is not reachable)."""
    try:
        with urllib.request.urlopen(f"http://{first}:{port}/{scope}/{key}", timeout=3) as reply:
            return reply.read()
    except OSError:  # 404 (not set), not serving yet, or gone
        return None


def _stopped_report(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": raw.decode(errors="replace")}


def _watch_for_stopped_host(read: Callable[[], Optional[bytes]], procs: list[subprocess.Popen], stopped: list,
                            done: threading.Event) -> None:
    """Until `done`: when `read()` gives a stopped host's report, keep it in `stopped` and terminate `procs`
    (this host's ranks, waiting in Gloo's rendezvous for ranks that will not come)."""
    while not done.wait(_STOPPED_POLL_SECONDS):
        raw = read()
        if raw is None:
            continue
        stopped.append(_stopped_report(raw))
        for p in procs:
            if p.poll() is None:
                p.terminate()
        return


def _start_rendezvous(port: int, plan: list):
    """Horovod's HTTP rendezvous server on 0.0.0.0:port, serving in a thread, initialised with the plan."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    try:
        server = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    except OSError as e:
        raise TrainError(f"--rendezvous-port {port}: cannot listen ({e})") from None
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    server.init(plan)
    return server


def _replay(reporter: Reporter) -> Callable[[dict], None]:
    def show(event: dict) -> None:
        if event.get("kind") == "step" and reporter.bar.total != event["total"]:
            reporter.bar.total = reporter.total = event["total"]  # the bar learns the length from rank 0
        reporter.replay(event)
    return show


def _leaf_differences(a, b, path: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested config dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _leaf_differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))]
    return [] if a == b else [path]


def _check_ranks_train_one_model(ranks: list[dict]) -> None:
    """Every rank (its host, code, --data, transform summary, config and run) must train one model: a host holding
    another copy of the data (a stale one at the same path, another day's) numbers the values otherwise, and
    the averaged gradients would train each row on values that differ by rank; another --config (a learning
    rate, a layer) or --steps would make the ranks step apart or wait on each other, without a word; and a host
    with another install (our packages, TensorFlow, Horovod) builds and steps the model with its own code."""
    first = ranks[0]
    where = lambda r, x: f"rank {r} (host {x['host']}, {x['data']})"  # noqa: E731
    for r, x in enumerate(ranks):
        code = identity_differences(first["code"], x["code"], "rank 0: ")
        if code:
            raise TrainError(f"{where(r, x)} runs other code than {where(0, first)}: {', '.join(code)}; each rank "
                             f"builds and steps the model with its own host's install, so install the same recpipe "
                             f"(and libraries) on every host")

    def differences(x: dict) -> list[str]:  # "transform": a mapping_summary, or "synthetic input"
        a, b = first["transform"], x["transform"]
        if isinstance(a, dict) and isinstance(b, dict):
            return summary_differences(a, b)
        return [] if a == b else ["the input (synthetic on one of them)"]
    other = [(r, x, d) for r, x in enumerate(ranks) if (d := differences(x))]
    if other:
        named = "; ".join(f"{where(r, x)}: {', '.join(d)} differ" for r, x, d in other[:4])
        raise TrainError(f"the ranks read data of different preprocess runs: {named}, against {where(0, first)}; an "
                         f"ID would stand for other values on different ranks. Give every host a whole copy of one "
                         f"run's output")
    for r, x in enumerate(ranks):
        keys = _leaf_differences(first["config"], x["config"]) + [k for k in ("steps", "precision")
                                                                    if x[k] != first[k]]
        if keys:
            shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
            raise TrainError(f"{where(r, x)} trains with another config or run than {where(0, first)}: {shown} "
                             f"differ; every host must run the same --config, --steps and --precision")


def run_rank(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int,
             say: Callable[[str], None]) -> TrainState:
    """The training loop of one Horovod rank."""
    import horovod.tensorflow as hvd

    cycle_ms = horovod_cycle_time_ms(cfg)
    with _environment({CYCLE_TIME_ENV: f"{cycle_ms:g}"}):  # read once, by hvd.init()'s background thread
        hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model_dir = ModelDir(opts.model_dir)
    peers = [{"host": "", "model_dir": opts.model_dir}]
    if size > 1:
        peers = hvd.allgather_object({
            "host": os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),  # the host list's name for it
            "model_dir": os.path.abspath(opts.model_dir), "data": opts.data_dir, "config": config_to_dict(cfg),
            "steps": total, "precision": opts.run.precision,
            "transform": "synthetic input" if opts.synthetic_input else artifact.mapping_summary(),
            "code": code_identity(SAME_SOURCE, SAME_VERSIONS)})
        _check_ranks_train_one_model(peers)

    def rank0_says_stop(flag: bool) -> bool:  # every rank must leave the loop at the same step
        return bool(hvd.broadcast(tf.constant(int(flag)), root_rank=0, name="early_stop").numpy())

    with precision_policy(opts.run.precision):
        tf.keras.utils.set_random_seed(cfg.train.seed)
        model = compiled_model(cfg, artifact, optimizer_for(cfg, opts.run.precision, loss_scale=True))
        optimizer = model.optimizer  # compiled as the local and PS strategies are: the same checkpoint layout
        ckpt, manager = model_dir.checkpoint(model, optimizer)
        if manager.latest_checkpoint:  # every rank restores the same files; broadcast keeps them identical
            ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        start = int(optimizer.iterations.numpy())
        if size > 1:  # rank 0's: a host whose own model dir holds no (or an older) checkpoint would loop more
            # steps and wait on collectives no other rank makes; its weights come from rank 0's broadcast below
            start = int(hvd.broadcast(tf.constant(start, tf.int64), root_rank=0, name="start_step").numpy())
        events = os.environ.get(EVENTS_ENV) if rank == 0 else None
        reporter = Reporter(say if rank == 0 else (lambda _: None), total, start, cfg.train.batch_size * size,
                            ranks=size, events_path=events)
        validator = (validator_for(cfg, artifact, opts.data_dir, model_dir, reporter.note)
                     if rank == 0 and not opts.synthetic_input else None)
        if start:
            reporter.note(f"train: resuming from {manager.latest_checkpoint} at step {start}")
        elif opts.warm_start:
            apply_warm_start(model, cfg, artifact, opts.warm_start, reporter.note)
        stopped = rank0_says_stop(validator is not None and validator.stopped)
        if start >= total or stopped:
            why = f"stopped early at step {start}" if start < total else f"trained {start} >= {total} steps"
            reporter.note(f"train: already {why}; nothing to do")
            reporter.close()
            return TrainState.unchanged(start, "horovod", opts.run.precision, cfg.train.batch_size, opts.data_dir)
        step = _step_function(cfg, model, optimizer)
        ctx = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=rank)
        seed = cfg.train.seed + start + rank
        if opts.synthetic_input:  # benchmarks: each rank's own random batch from memory, no shard parsing
            sizes = {f.name: artifact.id_space_size(f) for f in cfg.features.sparse}
            it = iter(synthetic_dataset(cfg, sizes, cfg.train.batch_size, seed))
        else:
            it = iter(make_dataset(cfg, opts.data_dir, "train", cfg.train.batch_size, training=True,
                                   input_context=ctx, seed=seed))
        writer = tf.summary.create_file_writer(os.path.join(model_dir.logs_dir, "train")) if rank == 0 else None
        every = min(cfg.train.checkpoint_every, total - start)
        auc = next((m for m in model.metrics if m.name == "auc"), None)
        loss = math.nan
        for i in range(start, total):
            loss_t = step(it)
            if i == start:
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(optimizer.variables(), root_rank=0)
            done = i + 1
            if done % every == 0 or done == total:
                loss = float(hvd.allreduce(loss_t, op=hvd.Average).numpy())
                reporter.interval_end(done)
                check_loss(loss, done, cfg, opts.data_dir)  # every rank sees the same loss: all stop
                if rank == 0:
                    manager.save(checkpoint_number=done)
                    auc_v = float(auc.result().numpy()) if auc is not None else None
                    with writer.as_default():
                        tf.summary.scalar("loss", loss, step=done)
                        if auc_v is not None:
                            tf.summary.scalar("auc", auc_v, step=done)
                    reporter.interval(done, loss, auc_v)
                    stop = validator is not None and validator(done, manager.latest_checkpoint)
                else:
                    stop = False
                    if reporter.first is None:
                        reporter.first = reporter.last
                if rank0_says_stop(stop):
                    total = done
                    break
        reporter.close()
        _check_ranks_agree(model, hvd)  # after rank 0's last save
        if rank != 0 and hvd.local_rank() == 0 and model_dir.latest_step() < total:  # a model dir of this host's own
            model_dir.note_kept_elsewhere(peers[0]["host"], peers[0]["model_dir"], total)
        overall, steady = reporter.rates(total)
        state = TrainState(total, total - start, start, overall, steady, loss, "horovod", opts.run.precision,
                           cfg.train.batch_size, ranks=size, sparse_gradients=cfg.train.sparse_gradients,
                           gradient_groups=cfg.train.gradient_groups, cycle_time_ms=cycle_ms,
                           data_dir=PreprocessedData(opts.data_dir).root,
                           best_step=validator.history.best_step if validator is not None else None,
                           allocator=loaded_allocator())
        if rank == 0:
            model_dir.write_state(state)
        return state


SAME_SOURCE = ("features", "trainers")  # what a rank builds, reads and steps the model with: the same on every host
SAME_VERSIONS = ("tensorflow", "tf-keras", "tensorflow-recommenders", "horovod", "numpy")
CYCLE_TIME_ENV = "HOROVOD_CYCLE_TIME"


def horovod_cycle_time_ms(cfg: Config) -> float:
    """The cycle time of Horovod's background thread for this run: HOROVOD_CYCLE_TIME when the
    environment sets it (horovodrun --cycle-time-ms does), else train.horovod_cycle_time_ms."""
    given = os.environ.get(CYCLE_TIME_ENV)
    if given is None:
        return cfg.train.horovod_cycle_time_ms
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TrainError(f"{CYCLE_TIME_ENV}={given!r}: expected milliseconds >= 0 (or unset it: "
                         f"train.horovod_cycle_time_ms is {cfg.train.horovod_cycle_time_ms:g})")
    return value


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """os.environ with `values` set, as it was afterwards (a rank run in the launcher's own process,
    --np 1, must not leave its settings to the next run there)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_ranks_agree(model: tf.keras.Model, hvd) -> None:
    """Every rank must end with the same weights (a missed or mis-grouped exchange lets them drift
    apart without any error): the ranks' sums of squared trainable weights (per variable in its own
    dtype, so no table is copied, then added in float64) are allgathered and must agree."""
    total = tf.add_n([tf.cast(tf.reduce_sum(tf.square(v)), tf.float64) for v in model.trainable_variables])
    sums = hvd.allgather(tf.reshape(total, [1]), name="weights_checksum").numpy()
    if sums.max() - sums.min() > 1e-6 * max(1.0, float(sums.max())):
        raise TrainError(f"Horovod ranks ended with different weights (sums of squared trainable weights per rank: "
                         f"{', '.join(f'{x:.9g}' for x in sums)}); the gradient exchange did not keep them in sync")


def _exchange_dense(mode: str, shape: tf.TensorShape, ranks: int, batch_rows: int) -> bool:
    """Whether a variable's IndexedSlices gradient is densified and allreduced rather than allgathered:
    the advisor's rule (trainers.advisor.allreduces_table), so `recpipe advise` predicts the exchange
    this runs."""
    if shape.rank != 2:
        return mode == "dense"
    return allreduces_table(int(shape[0]), int(shape[1]), ranks, batch_rows, mode)


def _step_function(cfg: Config, model: tf.keras.Model, optimizer) -> Callable:
    """One synchronous step on an iterator's next batch: local gradients (accumulated over micro-batches
    if configured), one exchange (allreduce; IndexedSlices allgathered or densified per
    train.sparse_gradients), apply."""
    import horovod.tensorflow as hvd

    as_dense = [_exchange_dense(cfg.train.sparse_gradients, v.shape, hvd.size(), cfg.train.batch_size)
                for v in model.trainable_variables]  # batch_size: rows per rank
    scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    accum = cfg.train.tuning.grad_accum_steps
    groups = cfg.train.gradient_groups or None  # None: one collective per tensor

    def reduce(grads: list) -> list:
        """Average over the ranks (IndexedSlices are allgathered), one collective per tensor or, per
        kind (dense tensors, IndexedSlices), `groups` grouped ones. The kinds are grouped apart:
        Horovod 0.28.1's grouped_allreduce mis-pairs the IndexedSlices of a mixed list with the list's
        first tensors (AttributeError: no dense_shape) unless every IndexedSlices comes first."""
        if hvd.size() == 1:  # nothing to average: a collective would only wait for the background thread's cycle
            return grads
        grads = [tf.convert_to_tensor(g) if dense and isinstance(g, tf.IndexedSlices) else g
                 for g, dense in zip(grads, as_dense)]
        if groups is None:
            return [None if g is None else hvd.allreduce(g, op=hvd.Average) for g in grads]
        out = list(grads)
        for sparse in (False, True):
            kind = [i for i, g in enumerate(grads) if g is not None and isinstance(g, tf.IndexedSlices) == sparse]
            for part in (kind[k::groups] for k in range(min(groups, len(kind)))):
                for i, g in zip(part, hvd.grouped_allreduce([grads[i] for i in part], op=hvd.Average)):
                    out[i] = g
        return out

    @tf.function(reduce_retracing=True)
    def step(iterator):
        batch = next(iterator)  # inside the function, as Keras' fit does: the batch's tensors never reach Python
        if accum > 1:  # accumulate locally over the micro-batches, then ONE exchange per step
            grads, loss = accumulated_gradients(model, batch, accum, optimizer if scaled else None)
            grads = reduce(grads)
        else:
            with tf.GradientTape() as tape:
                loss = model.compute_loss(batch, training=True)
                target = optimizer.get_scaled_loss(loss) if scaled else loss
            grads = reduce(tape.gradient(target, model.trainable_variables))
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step
