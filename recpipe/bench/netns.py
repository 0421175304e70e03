"""Several "hosts" on one Linux machine: network namespaces joined by a bridge, for running and
measuring the cluster paths (PS, Horovod, Dask) over a real network stack.

Each host is a namespace with one interface `eth0` (ADDRESS/24, e.g. 10.78.0.1 for host 0) whose veth
peer sits on a bridge inside a namespace of its own, so nothing is added to the machine's own
network. Links can be shaped with `tc tbf` (netem is not assumed). A host can be given names to resolve
(`know`: lines of its own /etc/hosts, which `ip netns exec` mounts from /etc/netns/NAME/hosts), as a
cluster's DNS learns a host's name when it starts. Everything is created on enter
and removed on exit, also when the body fails; namespaces left by a killed run (their owner pid
is gone) are removed by the next one. Needs root (CAP_NET_ADMIN) and iproute2.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Optional, Sequence

__all__ = ["VirtualHosts", "netns_available", "NetnsError"]

PREFIX = "rp"            # namespace names: rp<owner pid>-br, rp<owner pid>-h<i>
SUBNET = "10.78.0"
NETNS_ETC = "/etc/netns"  # `ip netns exec NS` bind-mounts /etc/netns/NS/FILE over /etc/FILE


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, ns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def netns_available() -> tuple[bool, str]:
    """(usable, why not): root and iproute2 are needed to create namespaces."""
    if shutil.which("ip") is None:
        return False, "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return True, ""


def _remove_stale() -> None:
    """Namespaces of ours whose owner process is gone (a run killed before it could clean up)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\S+)", listed, flags=re.M):
        ns, pid = name[0], int(name[1])
        if not os.path.exists(f"/proc/{pid}"):
            _kill_processes(ns)
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)


def _kill_processes(ns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


class VirtualHosts:
    """`with VirtualHosts(4, rate="1gbit") as hosts: hosts.popen(0, [...])`"""

    def __init__(self, n: int, rate: Optional[str] = None, subnet: str = SUBNET):
        if not 1 <= n <= 250:
            raise ValueError(f"hosts: 1..250, got {n}")
        self.n, self.rate, self.subnet = n, rate, subnet
        tag = f"{PREFIX}{os.getpid()}"
        self.bridge_ns = f"{tag}-br"
        self.names = [f"{tag}-h{i}" for i in range(n)]
        self._procs: list[subprocess.Popen] = []

    # ------------------------------------------------------------ set-up / tear-down
    def __enter__(self) -> "VirtualHosts":
        _remove_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        subprocess.run(["ip", "netns", "add", self.bridge_ns], check=True, capture_output=True)
        _ip("link", "add", "br0", "type", "bridge", ns=self.bridge_ns)
        _ip("link", "set", "br0", "up", ns=self.bridge_ns)
        for i, ns in enumerate(self.names):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            peer = f"v{i}"
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", peer, "netns", self.bridge_ns)
            _ip("link", "set", peer, "master", "br0", ns=self.bridge_ns)
            _ip("link", "set", peer, "up", ns=self.bridge_ns)
            _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
        if self.rate:
            self.shape(self.rate)

    def know(self, i: int, names: dict[int, str]) -> None:
        """Host i resolves each names[j] to host j's address from now on (its /etc/hosts, appended in place:
        a running process's resolver reads it at its next lookup). Before a host's first `know`, its commands
        see the machine's own /etc/hosts."""
        folder = os.path.join(NETNS_ETC, self.names[i])
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "hosts")
        with open(path, "a") as fh:
            if fh.tell() == 0:
                fh.write("127.0.0.1 localhost\n")
            fh.writelines(f"{self.address(j)} {name}\n" for j, name in names.items())

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in [*self.names, self.bridge_ns]:
            _kill_processes(ns)
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)

    # ------------------------------------------------------------ use
    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def shape(self, rate: Optional[str]) -> None:
        """Every host's link shaped to `rate` (tc tbf, e.g. "1gbit", "100mbit"); None removes it."""
        for ns in self.names:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"],
                           capture_output=True)
            if rate:
                # burst: at least rate/HZ (250) plus a few MTUs; latency bounds the queue.
                bits = _rate_bits(rate)
                burst = max(bits // 8 // 250, 32 * 1514)
                subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                                "rate", rate, "burst", str(burst), "latency", "50ms"], check=True,
                               capture_output=True)
        self.rate = rate

    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.names[i], *cmd]

    def popen(self, i: int, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `cmd` on host i; killed on exit if still running."""
        proc = subprocess.Popen(self.command(i, cmd), **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, i: int, cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(i, cmd), **kwargs)

    def wait_listening(self, i: int, port: int, timeout: float = 120.0,
                       proc: Optional[subprocess.Popen] = None) -> None:
        """Until something accepts TCP connections on host i's address:port (checked from host i)."""
        deadline = time.monotonic() + timeout
        probe = ["python3", "-c", "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)",
                 self.address(i), str(port)]
        while self.run(i, probe, capture_output=True).returncode != 0:
            if proc is not None and proc.poll() is not None:
                raise NetnsError(f"host {i}: process exited ({proc.returncode}) before listening on {port}")
            if time.monotonic() > deadline:
                raise NetnsError(f"host {i}: nothing listening on {self.address(i)}:{port} after {timeout:.0f}s")
            time.sleep(0.3)


def _rate_bits(rate: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use e.g. 100mbit, 1gbit")
    return int(float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]])
