"""Ctrl-C (and SIGTERM) during ``Tuner.fit``: Tune catches the first SIGINT itself (ray/tune/tune.py
``_setup_signal_catching``), saves its experiment state and returns normally, so the driver
cannot tell an interrupted sweep from a finished one. We watch for it.

Tune's handler remembers the handler installed before ``fit`` and puts it back after the
first SIGINT; it never puts it back after a normal end. So: install our own handler before
``fit``; if ours is the one in place afterwards (or it ran, on a second Ctrl-C), the sweep was
interrupted. The trials' statuses are a second witness: an uninterrupted fit ends every trial
TERMINATED or ERROR.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["fit_watching_sigint", "incomplete_trials", "SweepInterrupted"]

_DONE = ("TERMINATED", "ERROR")


class SweepInterrupted(Exception):
    """Ctrl-C stopped a sweep; Tune saved its state and ``geosweep resume`` continues it."""

    def __init__(self, root: Any, how: str = ""):
        self.root = root
        super().__init__(how or f"geosweep resume {root}")


def incomplete_trials(grid: Any) -> int:
    """Trials of a ResultGrid that neither finished nor errored (pending, running, paused)."""
    analysis = getattr(grid, "_experiment_analysis", None)
    trials = getattr(analysis, "trials", None) or []
    return sum(1 for t in trials if getattr(t, "status", "TERMINATED") not in _DONE)


def fit_watching_sigint(tuner: Any) -> tuple[Any, bool]:
    """``(tuner.fit(), interrupted)``. A second Ctrl-C (Tune has put our handler back) raises
    KeyboardInterrupt as usual."""
    if threading.current_thread() is not threading.main_thread():
        grid = tuner.fit()
        return grid, incomplete_trials(grid) > 0
    hit = threading.Event()

    def ours(sig: int, frame: Any) -> None:
        hit.set()
        raise KeyboardInterrupt

    def term(sig: int, frame: Any) -> None:
        # SIGTERM (kill, a job scheduler) is a Ctrl-C: whatever handles SIGINT now (Tune's
        # first, ours after it) runs. Ray's own handlers (a Python sys.exit and a C++ one
        # that aborts with a stack dump) left the parent run RUNNING and no resume hint.
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, ours)
    signal.signal(signal.SIGTERM, term)
    try:
        grid = tuner.fit()
        interrupted = hit.is_set() or signal.getsignal(signal.SIGINT) is ours
        return grid, interrupted or incomplete_trials(grid) > 0
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term if previous_term is not None
                      else signal.SIG_DFL)
