"""The PS and worker tasks of a ParameterServerStrategy cluster, seen from the coordinator without TensorFlow:
which ones answer, waiting for them at the start, and watching them while the job runs.

TensorFlow's coordinator learns that a task is gone only from a failed RPC. A task whose process dies resets
its connections and fails the RPCs at once; a task whose host is cut off from the network (its link down,
its process alive) fails none: TCP retransmits for about 15 minutes, and the job hangs without a word.
TaskWatch probes every task with a TCP connect every few seconds; one that has not answered for
`timeout` seconds is declared cut off, and the coordinator's own connections to it are shut down, so the RPCs
waiting on them fail as a dead task's do: a worker's step is run again on another worker (and the worker
rejoins once it answers), a PS task's failure stops the job, named by the watch's verdict.
"""
from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
from typing import Callable, Optional

from recpipe.trainers.errors import TrainError
from recpipe.trainers.strategies.tf_config import PSCluster

__all__ = ["Task", "TaskWatch", "disconnect", "silent_tasks", "task_names", "wait_for_tasks"]

Task = tuple[str, int, str, str]  # (job, index, address, why it does not answer)


def silent_tasks(cluster: PSCluster, jobs: tuple[str, ...] = ("ps",), timeout: float = 2.0) -> list[Task]:
    """Every task of `jobs` in `cluster` that does not accept a TCP connection now, probed at once.

    Args:
        cluster: the PS cluster.
        jobs: the jobs whose tasks are probed ("ps", "worker").
        timeout: seconds a connect may take.

    Returns:
        (job, index, address, why) of each silent task: a task not started yet, one that died ("Connection
        refused"), or one whose host went away ("timed out").
    """
    tasks = [(job, i, address) for job in jobs for i, address in enumerate(cluster.spec()[job])]

    def probe(address: str) -> Optional[str]:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
            return None
        except OSError as e:
            return "timed out" if isinstance(e, socket.timeout) else e.strerror or str(e)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(tasks) or 1)) as pool:
        whys = list(pool.map(probe, [address for _, _, address in tasks]))
    return [(job, i, address, why) for (job, i, address), why in zip(tasks, whys) if why is not None]


def task_names(tasks: list[Task]) -> str:
    """"PS task 1 (10.0.0.3:2222: timed out); worker 0 (...)" for `tasks` as silent_tasks gives them."""
    name = {"ps": "PS task", "worker": "worker"}
    return "; ".join(f"{name.get(job, job)} {i} ({address}: {why})" for job, i, address, why in tasks)


def wait_for_tasks(cluster: PSCluster, timeout: float, say: Callable[[str], None], every: float = 30.0) -> None:
    """Until every PS and worker task of `cluster` accepts connections. TensorFlow's coordinator waits on a
    missing task without a word, for ever; this says which tasks it waits for (at once, then every `every`
    seconds).

    Raises:
        TrainError: naming the tasks still silent after `timeout` seconds.
    """
    start = time.monotonic()
    said = None
    while True:
        silent = silent_tasks(cluster, ("ps", "worker"))
        waited = time.monotonic() - start
        if not silent:
            if said is not None:
                say(f"train: every PS and worker task serves (after {waited:.0f} s)")
            return
        if waited >= timeout:
            worker = any(job == "worker" for job, *_ in silent)
            raise TrainError(f"{task_names(silent)}: not serving after {timeout:g} s (--cluster-wait-seconds); is "
                             f"`recpipe train` running there with that TF_CONFIG task, and can this host reach it?"
                             + (" A worker whose own copy of --data is not this run's stops before it serves, "
                                "naming why in its own log." if worker else ""))
        if said is None or time.monotonic() - said >= every:
            say(f"train: waiting for {task_names(silent)} to serve ({waited:.0f} s of {timeout:g})")
            said = time.monotonic()
        time.sleep(0.5)


def _endpoints(address: str) -> set[tuple[str, int]]:
    """The (IP, port) pairs `address` (host:port) resolves to; empty when it does not resolve."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return set()
    return {(info[4][0], int(port)) for info in infos}


def _remote(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp's "0100007F:08AE" (or tcp6's 32 hex digits) as ("127.0.0.1", 2222)."""
    ip_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(ip_hex)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host-endian
    if len(words) == 16 and words[:12] == b"\0" * 10 + b"\xff\xff":  # an IPv4-mapped IPv6 address
        words = words[12:]
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port_hex, 16)


def _socket_inodes(endpoints: set[tuple[str, int]]) -> set[str]:
    """Inodes of this process's TCP sockets connected (or connecting) to one of `endpoints`."""
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] != "0A" and _remote(fields[2]) in endpoints:  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def disconnect(address: str) -> int:
    """Shut down this process's own TCP connections to `address` (host:port), so every RPC waiting on one
    fails at once ("Socket closed") instead of waiting out TCP's retransmissions to a host that went away.

    Args:
        address: a task's host:port, as in TF_CONFIG.

    Returns:
        How many connections were shut down.
    """
    inodes = _socket_inodes(_endpoints(address))
    if not inodes:
        return 0
    done = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if not (target.startswith("socket:[") and target[8:-1] in inodes):
            continue
        try:
            with socket.socket(fileno=os.dup(int(fd))) as s:  # a second descriptor of the same socket
                s.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:  # closed meanwhile, or not connected yet
            pass
    return done


class TaskWatch:
    """Probes every PS and worker task of `cluster` every `every` seconds while the coordinator runs the job.

    A task that has not answered for `timeout` seconds is declared cut off: said once, and this process's
    connections to it are shut down (and again at each probe while it stays silent), so TensorFlow's RPCs to
    it fail as a dead task's would. A PS task declared cut off is kept in `lost_ps`, which names the task when
    the job stops; if the job has not stopped `grace` seconds later, `on_stuck` is called with that list
    (the coordinator then exits naming it). A worker that answers again is said to be back.
    """

    def __init__(self, cluster: PSCluster, timeout: float, say: Callable[[str], None], every: float = 2.0,
                 grace: float = 30.0, on_stuck: Optional[Callable[[list[Task]], None]] = None):
        self.cluster, self.timeout, self.say, self.every = cluster, timeout, say, every
        self.grace, self.on_stuck = grace, on_stuck
        self.lost_ps: list[Task] = []
        self.cut_off: dict[tuple[str, int], float] = {}  # declared tasks -> when they were declared
        self._silent_since: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> TaskWatch:
        self._thread = threading.Thread(target=self._run, name="ps-task-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.look(time.monotonic())

    def look(self, now: float) -> None:
        """One round: probe every task, declare the ones silent for `timeout` seconds, shut down connections to
        the declared, and call on_stuck once a lost PS task has not stopped the job after `grace` seconds."""
        silent = {(job, i): (address, why) for job, i, address, why in
                  silent_tasks(self.cluster, ("ps", "worker"), timeout=min(2.0, self.every))}
        if self._stop.is_set():
            return
        for key in list(self._silent_since):
            if key not in silent:
                del self._silent_since[key]
                if self.cut_off.pop(key, None) is not None:
                    self.say(f"train: {task_names([(*key, self._address(key), 'answers again')])}")
        for key, (address, why) in silent.items():
            since = self._silent_since.setdefault(key, now)
            if now - since < self.timeout:
                continue
            if key not in self.cut_off:
                self.cut_off[key] = now
                task = (*key, address, f"no answer for {now - since:.0f} s: {why}")
                state = "cut off" if why == "timed out" else "lost"  # no answer at all, or a refused connection
                self.say(f"train: {task_names([task])}: {state} (--task-timeout-seconds {self.timeout:g}); "
                         + ("the job stops" if key[0] == "ps" else "its steps run on the other workers"))
                if key[0] == "ps":
                    self.lost_ps.append(task)
            disconnect(address)
        stuck = [task for task in self.lost_ps if now - self.cut_off.get(task[:2], now) >= self.grace]
        if stuck and self.on_stuck is not None:
            self.on_stuck(list(self.lost_ps))

    def _address(self, key: tuple[str, int]) -> str:
        return self.cluster.spec()[key[0]][key[1]]
