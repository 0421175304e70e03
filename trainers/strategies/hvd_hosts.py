"""Horovod across hosts without ssh: every host runs `recpipe train --strategy horovod --hosts H1[:S],H2[:S]
--host-index I` and starts its S ranks with the environment horovodrun would give them (the Gloo interface
is the one holding the host's address).

The first host serves Horovod's rendezvous (its HTTP key-value store) from the start of its command. Hosts
start in any order: every other host waits for that store to answer before starting its ranks (Gloo's own
client gives up after a few refused connections, and the rank dies by SIGABRT). A host that stops before
starting its ranks puts its error in the store (the first host in its own), every other host's launcher
looks there, stops its ranks and names it, and the first host serves the report until the others have read
it. Otherwise the other hosts' ranks would wait in Gloo's rendezvous for ranks that never come
(HOROVOD_GLOO_TIMEOUT_SECONDS, 300 s) and die by SIGABRT, naming nothing."""
from __future__ import annotations

import contextlib
import email.utils
import json
import math
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Callable, Iterator, Optional

from recpipe.common.errors import RecpipeError
from recpipe.trainers.errors import JobFault, TrainError
from recpipe.trainers.strategies.hvd_launch import horovodrun, inside_horovod_job, rank_command, rank_death, supervise, written_state
from recpipe.trainers.model_dir import ModelDir, TrainState
from recpipe.trainers.options import RunOptions, TrainOptions, host_list

__all__ = ["HostJob", "StoppedElsewhere", "LostElsewhere", "host_job", "slot_env", "interface_of", "gloo_timeout_seconds"]

# Where a host that stops before starting its ranks says why: keys of the first host's rendezvous store
# (Gloo's own keys are in the "global" scope). seen_<I>: host I's launcher has read the report.
_SCOPE = "recpipe"
_STOPPED = "host_stopped"
_POLL_SECONDS = 2.0   # how often every host's launcher looks for a report
_TELL_SECONDS = 30.0  # how long a stopped host tries to reach the store, and the first host serves a report
_SYMPTOM_SECONDS = 5.0  # how long a host whose rank saw another rank end waits for that rank's host's report
_SAY_EVERY = 30.0     # how often a host waiting for the first host's store says so
_STALE_SLACK_SECONDS = 5.0  # a report stored longer than this process has run, and this more, is stale


class StoppedElsewhere(TrainError):
    """The job stopped for another host: this host has nothing of its own to report to the others."""


class LostElsewhere(StoppedElsewhere, JobFault):
    """The job stopped for a rank lost on another host: a job fault, which --max-restarts restarts."""


def gloo_timeout_seconds() -> float:
    """How long Gloo's rendezvous waits for the ranks (HOROVOD_GLOO_TIMEOUT_SECONDS, Horovod's 300 s), and
    a host for the first host's store."""
    return float(os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "300"))


@contextlib.contextmanager
def host_job(run: RunOptions, say: Callable[[str], None], attempt_of: Optional[HostJob] = None
             ) -> Iterator[Optional[HostJob]]:
    """This host's part of a job over --hosts for one attempt of the `recpipe train` command; None for any
    other run. attempt_of: the previous attempt's part, whose report of why it stopped is not this one's."""
    if not run.hosts or inside_horovod_job():
        yield None
        return
    with HostJob(run, say, attempt_of.report_id if attempt_of is not None else None) as job:
        yield job


class HostJob:
    """This host's part of a job over --hosts: the first host's rendezvous server, or waiting for it; this
    host's ranks; and the reports through that server's store of why the job stopped."""

    def __init__(self, run: RunOptions, say: Callable[[str], None], previous_report: Optional[str] = None):
        horovodrun()  # Horovod built for this TensorFlow, or a clear error
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        self.run, self.say = run, say
        self.hosts = parse_hosts(",".join(f"{h}:{n}" for h, n in host_list(run.hosts)))
        self.plan = get_host_assignments(self.hosts, sum(h.slots for h in self.hosts))
        self.index = {h.hostname: i for i, h in enumerate(self.hosts)}
        self.me = self.hosts[run.host_index].hostname
        # the first host's address, for the ranks' Gloo client: known once its store answers (a scheduler's
        # DNS name, e.g. a Kubernetes pod's, resolves only once that host is up)
        self.first: Optional[str] = _address(self.me) if run.host_index == 0 else None
        self.server = None  # the first host's rendezvous server
        self.ranks_started = threading.Event()
        self.stopped: list[dict] = []  # the first report of why the job stopped: a host before starting its
                                       # ranks, or a rank's own death
        self.report_id: Optional[str] = None  # the id of the report that stopped this attempt (sent or read)
        self.previous_report = previous_report  # the id of the one that stopped this command's previous attempt

    def __enter__(self) -> HostJob:
        if self.run.host_index == 0:
            self.server = _start_rendezvous(self.first, self.run.rendezvous_port, self.plan)
        return self

    def __exit__(self, kind, error, tb) -> bool:
        try:
            if (error is not None and not self.ranks_started.is_set()
                    and not isinstance(error, (KeyboardInterrupt, StoppedElsewhere))):
                text = str(error) if isinstance(error, RecpipeError) else f"{type(error).__name__}: {error}"
                self._report(f"host {self.run.host_index} ({self.me}) stopped before starting its ranks: {text}",
                             _TELL_SECONDS)
            if self.server is not None and self.stopped:  # a report, served until the other hosts have read it
                self._serve_until_read(self.stopped[0].get("index"))
        finally:
            if self.server is not None:
                self.server.shutdown()
                self.server.server_close()  # the port is free for the next attempt's server
        return False

    @property
    def _where(self) -> str:
        return f"{self.hosts[0].hostname}:{self.run.rendezvous_port}"

    def launch(self, opts: TrainOptions, total: int) -> TrainState:
        """Start this host's ranks (once the first host's store answers) and supervise them."""
        say = self.say
        iface = interface_of(_address(self.me, gloo_timeout_seconds(), self.say))
        mine = [slot for slot in self.plan if slot.hostname == self.me]
        say(f"train: horovod host {self.run.host_index} ({self.me}, {iface}): ranks {[s.rank for s in mine]} of "
            f"{len(self.plan)}; rendezvous {self._where}")
        if self.server is None:
            self._wait_for_first_host(opts)
        procs: list[subprocess.Popen] = []

        def start(env: dict) -> list[subprocess.Popen]:
            self.ranks_started.set()
            procs.extend(subprocess.Popen(rank_command(opts), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, env=dict(os.environ, **env,
                                                              **slot_env(slot, self.first, self.run.rendezvous_port,
                                                                         iface)))
                         for slot in mine)
            return procs

        done = threading.Event()
        if self.server is not None:
            threading.Thread(target=_watch_rendezvous, args=(self.server, self.plan, self.index, say, done),
                             daemon=True).start()
        threading.Thread(target=self._watch_for_stopped_host, args=(procs, done), daemon=True).start()
        try:
            results = supervise(start, say)
        finally:
            done.set()
        failed = sorted((order, slot.rank, rc, tail) for slot, (rc, tail, order) in zip(mine, results)
                        if order is not None)
        if failed and not self.stopped:
            raise self._rank_died(opts, *failed[0][1:])
        if self.stopped:
            raise self._stopped_error(opts)
        if any(slot.rank == 0 for slot in mine):
            return written_state(opts)
        say(f"train: ranks on {self.me} finished; rank 0 on {self.hosts[0].hostname} wrote the model dir")
        shared = ModelDir(opts.model_dir).state()  # readable here when the model dir is on shared storage
        return shared or TrainState(total, 0, 0, 0.0, 0.0, math.nan, "horovod", self.run.precision, 0,
                                    ranks=len(self.plan))

    def _rank_died(self, opts: TrainOptions, rank: int, code: int, output: list[str]) -> TrainError:
        """The error for this host's rank that failed first. A death of its own (a signal, its own error) is
        reported to the other hosts, whose ranks see only their collectives fail; a death that only shows
        another rank's end waits a moment for that rank's host's report."""
        host_of = {slot.rank: (self.index[slot.hostname], slot.hostname) for slot in self.plan}
        death = rank_death(rank, code, f" on {self.me}", output, host_of)
        if death.first_hand:
            self._report(death.cause, _SYMPTOM_SECONDS, fault=True)
            return JobFault(str(self._stopped(opts, death.cause)), death.cause)
        deadline = time.monotonic() + _SYMPTOM_SECONDS
        while (answered := self._look()) and not self.stopped and time.monotonic() < deadline:
            time.sleep(0.5)
        if self.stopped:
            return self._stopped_error(opts)
        gone = "" if answered else (
            f"; the first host's rendezvous ({self._where}) does not answer either: is `recpipe train ... "
            f"--host-index 0` on {self.hosts[0].hostname} still running, and its host up?")
        return JobFault(str(self._stopped(opts, death.cause + gone)), death.cause + gone)

    def _wait_for_first_host(self, opts: TrainOptions) -> None:
        """Until the first host's store answers (or says a host stopped), up to gloo_timeout_seconds(). A
        report stored before this process started is an earlier attempt's, which the first host serves until
        the others have read it (this host restarted: a Kubernetes pod's container): wait for the next one."""
        timeout, t0, said, stale = gloo_timeout_seconds(), time.monotonic(), None, None
        first = f"`recpipe train ... --host-index 0` on {self.hosts[0].hostname}"
        while True:
            answered, report, age = self._fetch_report()
            if report is not None and self._previous(report):  # served until every host has read it; then the
                answered, report = False, None                  # first host starts this attempt's rendezvous
            if report is not None and age <= _process_age() + _STALE_SLACK_SECONDS:
                self._keep(report)
                raise self._stopped_error(opts)
            if report is not None and stale is None:
                stale = report
                self._keep(report, seen_only=True)
                self.say(f"train: the first host's rendezvous ({self._where}) still serves an attempt that stopped "
                         f"{age:.0f} s ago, before this command started ({report['cause']}); waiting for its next")
            if answered and report is None:
                self.first = _address(self.hosts[0].hostname)
                return
            waited = time.monotonic() - t0
            if waited >= timeout:
                last = f"; its last answer was an earlier attempt's end: {stale['cause']}" if stale else ""
                raise StoppedElsewhere(str(self._stopped(
                    opts, f"the first host's rendezvous ({self._where}) did not answer in {timeout:.0f} s "
                          f"(HOROVOD_GLOO_TIMEOUT_SECONDS): is {first} running, or did it stop before serving it "
                          f"(its own output says why)?{last}")))
            if said is None or time.monotonic() - said >= _SAY_EVERY:
                self.say(f"train: waiting for the first host's rendezvous ({self._where}) to answer ({waited:.0f} s of "
                         f"up to {timeout:.0f}): is {first} running?")
                said = time.monotonic()
            time.sleep(1.0)

    def _look(self) -> bool:
        """Read the store for a stopped host's report (kept in self.stopped; a host other than the first says
        it has read it); whether the store answered."""
        if self.server is not None:
            with self.server.cache_lock:
                raw = self.server.cache.get(_SCOPE, {}).get(_STOPPED)
                report = None if raw is None else _stopped_report(raw)
                if report is not None and "stored_at" not in report:  # another host's: when it came, by this
                    report["stored_at"] = time.time()                 # host's clock, as the others will read it
                    self.server.cache[_SCOPE][_STOPPED] = json.dumps(report).encode()
            answered = True
        else:
            answered, report, _ = self._fetch_report()
        if report is not None and not self._previous(report):
            self._keep(report)
        return answered

    def _previous(self, report: dict) -> bool:
        """Whether `report` is the one that stopped this command's previous attempt (the first host serves it
        until every host has read it, and this host may read it again as its next attempt starts)."""
        return self.previous_report is not None and report.get("id") == self.previous_report

    def _fetch_report(self) -> tuple[bool, Optional[dict], float]:
        """From the first host's store: (whether it answered, a stopped host's report or None, how long the
        report has been stored, by the first host's clock: its reply's Date less the report's stored_at)."""
        answered, raw, now = _fetch(f"http://{self._where}/{_SCOPE}/{_STOPPED}")
        report = None if raw is None else _stopped_report(raw)
        age = max(0.0, now - report["stored_at"]) if report and now and "stored_at" in report else 0.0
        return answered, report, age

    def _keep(self, report: dict, seen_only: bool = False) -> None:
        """Keep the first report this host reads (unless seen_only), and tell the first host it has read it."""
        if not seen_only and not self.stopped:
            self.stopped.append(report)
            self.report_id = report.get("id")
        if self.server is None:
            _put(f"http://{self._where}/{_SCOPE}/seen_{self.run.host_index}", b"1")

    def _watch_for_stopped_host(self, procs: list[subprocess.Popen], done: threading.Event) -> None:
        """Until `done`: on a stopped host's report, terminate this host's ranks (waiting in Gloo's rendezvous
        for ranks that will not come)."""
        while not done.wait(_POLL_SECONDS):
            self._look()
            if self.stopped:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                return

    def _stopped(self, opts: TrainOptions, cause: str) -> TrainError:
        """The error of a job that `cause` stopped, with what a rerun does: a host without rank 0 says where
        the checkpoints are (its own model dir holds none, so "no checkpoint was written yet; a rerun starts
        over" would mislead)."""
        return ModelDir(opts.model_dir).stopped(cause, kept_on=None if self.run.host_index == 0
                                                else self.hosts[0].hostname)

    def _stopped_error(self, opts: TrainOptions) -> StoppedElsewhere:
        cause = self.stopped[0]["cause"]
        if self.stopped[0].get("fault"):
            return LostElsewhere(str(self._stopped(opts, cause)), cause)
        return StoppedElsewhere(str(self._stopped(opts, cause)))

    def _report(self, cause: str, wait: float, fault: bool = False) -> None:
        """Tell the other hosts' launchers why the job stops here: the first host keeps `cause` in its own store
        (served until they have read it, on leaving), another host puts it there, trying for `wait` seconds.
        fault: a rank lost (a job fault, which --max-restarts restarts), not this host's inputs."""
        report = {"index": self.run.host_index, "host": self.me, "cause": cause, "fault": fault,
                  "id": uuid.uuid4().hex}
        self.report_id = report["id"]
        if self.server is not None:
            report["stored_at"] = time.time()
            with self.server.cache_lock:
                self.server.cache.setdefault(_SCOPE, {})[_STOPPED] = json.dumps(report).encode()
            self.stopped.append(report)
            return
        body = json.dumps(report).encode()
        url, deadline = f"http://{self._where}/{_SCOPE}/{_STOPPED}", time.monotonic() + wait
        while not _put(url, body):  # the first host may not serve yet
            if time.monotonic() >= deadline:
                self.say(f"train: could not tell the first host's rendezvous ({self._where}) why the job stopped "
                         f"here; the other hosts' ranks see only their own errors")
                return
            time.sleep(1.0)
        self.say(f"train: told the first host's rendezvous ({self._where}) why the job stopped here")

    def _serve_until_read(self, reporter: Optional[int]) -> None:
        """On the first host: keep serving the report until every other host (but the one that stopped) has
        read it, for up to _TELL_SECONDS."""
        others = [i for i in range(1, len(self.hosts)) if i != reporter]
        deadline, said = time.monotonic() + _TELL_SECONDS, False
        while True:
            with self.server.cache_lock:
                seen = set(self.server.cache.get(_SCOPE, {}))
            left = [i for i in others if f"seen_{i}" not in seen]
            if not left:
                return
            named = ", ".join(f"host {i} ({self.hosts[i].hostname})" for i in left[:6])
            if time.monotonic() >= deadline:
                self.say(f"train: {named} did not read that the job stopped in {_TELL_SECONDS:.0f} s; a host that "
                         f"starts later waits for this rendezvous until HOROVOD_GLOO_TIMEOUT_SECONDS")
                return
            if not said:
                self.say(f"train: serving the rendezvous until {named} read that the job stopped (up to "
                         f"{_TELL_SECONDS:.0f} s)")
                said = True
            time.sleep(0.5)


def _fetch(url: str) -> tuple[bool, Optional[bytes], Optional[float]]:
    """(whether the store answered, the key's value or None when it is not set, the reply's Date: the
    store's clock, to 1 s)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            date = reply.headers.get("Date")
            return True, reply.read(), email.utils.parsedate_to_datetime(date).timestamp() if date else None
    except urllib.error.HTTPError:  # 404: serving, the key is not set
        return True, None, None
    except (OSError, ValueError):  # not serving (yet, or any more), or not reachable
        return False, None, None


def _process_age() -> float:
    """Seconds since this process started (by this host's clock)."""
    import psutil  # Horovod's own dependency
    return time.time() - psutil.Process().create_time()


def _put(url: str, body: bytes) -> bool:
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=3).close()
        return True
    except OSError:
        return False


def _stopped_report(raw: bytes) -> dict:
    try:
        report = json.loads(raw)
    except ValueError:
        report = None
    return report if isinstance(report, dict) and "cause" in report else {"cause": raw.decode(errors="replace")}


def slot_env(slot, rendezvous_addr: str, rendezvous_port: int, iface: str) -> dict[str, str]:
    """The environment horovodrun --gloo gives one rank (horovod.runner.gloo_run)."""
    return {"HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": iface,
            "HOROVOD_GLOO_TIMEOUT_SECONDS": f"{gloo_timeout_seconds():g}"}


def _address(host: str, wait: float = 0.0, say: Callable[[str], None] = print) -> str:
    """`host`'s IPv4 address, trying for `wait` seconds (a scheduler's DNS may not know a host just started)."""
    deadline, said = time.monotonic() + wait, False
    while True:
        try:
            return socket.gethostbyname(host)
        except OSError as e:
            if time.monotonic() >= deadline:
                raise TrainError(f"--hosts: cannot resolve {host!r} ({e})") from None
            if not said:
                say(f"train: waiting for {host!r} to resolve ({e})")
                said = True
            time.sleep(1.0)


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
    seen: set[int] = set()  # every rank whose keys were in the store at a look
    while not done.wait(1.0):
        with server.cache_lock:
            keys = list(server.cache.get("global", {}))
        joined = {int(m[1]) for m in map(_RANK_KEY.fullmatch, keys) if m}
        if seen and not joined:  # Gloo clears its keys once every rank has joined: the rendezvous is done
            return
        seen |= joined
        missing = [slot for slot in plan if slot.rank not in seen]
        if not missing:
            return
        now = time.monotonic()
        first_join = first_join if first_join is not None or not seen else now
        if first_join is None or now - first_join < after or (said is not None and now - said < every):
            continue
        named = ", ".join(f"rank {slot.rank} (host {index[slot.hostname]}, {slot.hostname})" for slot in missing[:6])
        say(f"train: waiting for {named}{' and more' if len(missing) > 6 else ''} to join Gloo's rendezvous "
            f"({now - first_join:.0f} s since rank {min(seen)} joined): is `recpipe train ... --host-index N` "
            f"running there?")
        said = now


def _start_rendezvous(address: str, port: int, plan: list):
    """Horovod's HTTP rendezvous server on the first host's address (the cluster interface alone: its store
    takes unauthenticated writes), serving in a thread, initialised with the plan."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    try:
        server = RendezvousHTTPServer((address, port), RendezvousHandler, 0)
    except OSError as e:
        raise TrainError(f"--rendezvous-port {port}: cannot listen on {address} ({e})") from None
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True).start()
    server.init(plan)
    return server
