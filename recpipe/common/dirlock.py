"""One writer at a time for a folder: a lock file held with flock(2) while a run writes.

The kernel releases the lock when its process ends, however it ends (kill -9 included), so a lock left
by a dead run is simply taken by the next one. The file records its holder (host, pid, start time,
command) for the error a second writer gets; it stays after release unless the lock removes it. On NFS,
Linux implements flock with the server's byte-range locks, so writers on different hosts exclude each
other too.

Locks are re-entrant within a process: a step that holds a folder's lock may call a function that takes
it again (the daily push holds the export base's lock around `export_model`, which takes it too).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Optional

from recpipe.common.errors import RecpipeError

__all__ = ["DirLock", "FolderInUseError"]

_HELD: dict[str, list] = {}  # realpath of a lock file -> [fd, depth], for this process
_GUARD = threading.Lock()


class FolderInUseError(RecpipeError, RuntimeError):
    """Another process holds the folder's lock; the message names it."""


class DirLock:
    """A context manager holding the lock file `path` exclusively.

    Args:
        path: the lock file (created with its folder when missing).
        what: what the lock guards, for the error (e.g. "model dir /m").
        wait_s: how long to wait for a holder to finish; 0 fails at once.
        remove: delete the file on release (for a lock file beside a user's folder). A process that opened
            the file before it was deleted finds it gone once it holds the lock, and opens it anew.
    """

    def __init__(self, path: str, what: str, wait_s: float = 0.0, remove: bool = False):
        self.path, self.what, self.wait_s, self.remove = path, what, wait_s, remove
        self._key: Optional[str] = None

    @classmethod
    def beside(cls, folder: str, what: str, wait_s: float = 0.0) -> "DirLock":
        """The lock of a folder that must hold nothing of ours: a hidden file beside it, `.NAME.lock`,
        removed on release.

        Args:
            folder: the folder the lock guards.
            what: what it is, for the error.
            wait_s: how long to wait for a holder to finish; 0 fails at once.

        Returns:
            The DirLock (not yet held).
        """
        path = os.path.abspath(folder)
        return cls(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock"), what, wait_s, remove=True)

    def __enter__(self) -> "DirLock":
        os.makedirs(os.path.dirname(os.path.abspath(self.path)) or ".", exist_ok=True)
        key = os.path.realpath(self.path)
        with _GUARD:
            if key in _HELD:
                _HELD[key][1] += 1
                self._key = key
                return self
        while True:
            fd = os.open(key, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                self._acquire(fd)
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, key):
                break
            os.close(fd)  # the holder deleted the file as it released it: lock the one at the path now
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_holder()).encode() + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        with _GUARD:
            _HELD[key] = [fd, 1]
        self._key = key
        return self

    def _acquire(self, fd: int) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise FolderInUseError(self._in_use(fd)) from None
                time.sleep(0.2)

    def _in_use(self, fd: int) -> str:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            holder = {}
        who = (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
               f"{holder.get('started', '?')}: {holder.get('command', '?')}") if holder else "another process"
        waited = f" after waiting {self.wait_s:g} s" if self.wait_s else ""
        return (f"{self.what} is in use by {who}{waited} (lock {self.path}); wait for it to end, or write "
                f"elsewhere")

    def __exit__(self, *exc) -> None:
        with _GUARD:
            entry = _HELD[self._key]
            entry[1] -= 1
            if entry[1]:
                return
            del _HELD[self._key]
        if self.remove:
            os.unlink(self._key)  # while still held: a waiter that opened it sees it gone
        fcntl.flock(entry[0], fcntl.LOCK_UN)
        os.close(entry[0])


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "command": " ".join(["recpipe", *sys.argv[1:]])[:300]}
