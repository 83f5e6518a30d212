"""Start a local Ray again when its raylet missed Ray's fixed registration window.

Ray 2.60 gives a new node's raylet 30 s to register with the GCS (``raylet_start_wait_time_s``
in ``ray/_private/node.py``, not configurable) and then raises "The current node timed out
during startup". On a 2-core machine whose cores are busy (a sweep of the user's beside a new
one, a test run beside a benchmark) the raylet can miss it while nothing is wrong (measured: a
test's local Ray failed so with three Rays on 2 cores, load 6-8; it started at once with one).
The failed ``ray.init`` leaves the head processes it started (GCS, raylet, dashboard, log
monitor) running as children of this process, holding ports and a session folder, and Ray keeps
no handle to stop them. So: end exactly those children (the processes this process started
during the attempt, read from /proc), then try once more. Any other error, or a platform
without /proc, is raised as it was.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

__all__ = ["STARTUP_TIMEOUT", "START_TRIES", "is_startup_timeout", "children", "end_processes",
           "init_with_retry"]

STARTUP_TIMEOUT = "timed out during startup"  # Ray's message for the 30 s raylet window
START_TRIES = 2  # one retry: a second miss on a machine that busy is reported, not looped


def is_startup_timeout(err: BaseException) -> bool:
    return STARTUP_TIMEOUT in str(err)


def children(pid: int | None = None, proc: str = "/proc") -> set[int] | None:
    """The pids whose parent is ``pid`` (default: this process), or None without /proc."""
    me = os.getpid() if pid is None else pid
    try:
        names = os.listdir(proc)
    except OSError:
        return None
    out = set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat")) as f:
                stat = f.read()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
        if ppid == me:
            out.add(int(name))
    return out


def end_processes(pids: set[int], wait_s: float = 5.0,
                  kill: Callable[[int, int], None] = os.kill) -> None:
    """SIGKILL ``pids`` and reap them (they are this process's children); a pid already gone
    is skipped. The raylet's own children (workers, agents) share its fate in Ray."""
    for pid in pids:
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # not ours to reap, or reaped already
            if done:
                left.discard(pid)
        if left:
            time.sleep(0.05)


def init_with_retry(init: Callable[[], Any], tries: int = START_TRIES,
                    list_children: Callable[[], set[int] | None] = children,
                    end: Callable[[set[int]], None] = end_processes,
                    log: Callable[[str], None] | None = None) -> Any:
    """``init()`` (a local ``ray.init``); on Ray's startup timeout, end the processes this
    attempt started and call it again, at most ``tries`` times in all."""
    for attempt in range(1, tries + 1):
        before = list_children()
        try:
            return init()
        except Exception as e:  # noqa: BLE001 - re-raised unless it is the startup timeout
            after = list_children() if before is not None else None
            if attempt == tries or not is_startup_timeout(e) or after is None:
                raise
            end(after - before)
            if log:
                log(f"Ray's raylet missed its 30 s start window (a busy machine); "
                    f"starting Ray again ({attempt + 1}/{tries})")
    raise AssertionError("unreachable")
