"""One writer per sweep folder: an exclusive ``flock`` on ``<sweep>/.lock``, held by the
driver from before anything is written until the process exits.

The kernel drops a flock when its holder dies (kill -9 included), so a stale lock is never
seen: the file may stay, the lock does not. The file holds the holder's pid, host and start
time, only for the message a second driver prints.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

__all__ = ["LOCK_FILE", "SweepLocked", "lock_sweep", "unlock_sweep", "holds_lock"]

LOCK_FILE = ".lock"
_HELD: dict[str, int] = {}  # resolved sweep folder -> the open fd holding its lock


class SweepLocked(RuntimeError):
    """Another live process writes this sweep folder; the message is one line."""


def holds_lock(root: str | os.PathLike) -> bool:
    return str(Path(root).resolve()) in _HELD


def lock_sweep(root: str | os.PathLike) -> Path:
    """Take the folder's lock (creating the folder); a no-op when this process holds it."""
    root = Path(root).resolve()
    if str(root) in _HELD:
        return root
    root.mkdir(parents=True, exist_ok=True)
    try:  # never through a symlink: a planted .lock -> ~/.bashrc would be truncated
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise SweepLocked(f"{root / LOCK_FILE} is a symlink; a sweep folder's lock is a "
                          "plain file: remove the link") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            who = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (ValueError, UnicodeDecodeError):
            who = {}
        os.close(fd)
        since = time.strftime("%H:%M:%S", time.localtime(who.get("started", 0))) \
            if who.get("started") else "?"
        raise SweepLocked(
            f"{root} is in use by another geosweep (pid {who.get('pid', '?')} on "
            f"{who.get('host', '?')}, since {since}): wait for it to end or stop it") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                              "started": time.time()}).encode(), 0)
    _HELD[str(root)] = fd
    return root


def unlock_sweep(root: str | os.PathLike) -> None:
    fd = _HELD.pop(str(Path(root).resolve()), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
