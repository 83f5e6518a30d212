"""A progress line when a long command would otherwise be silent.

``Heartbeat`` runs a daemon thread that prints ``[prefix] <what is happening> (Ns)`` whenever
nothing was printed through it for ``every`` seconds; commands print through ``hb.say`` and set
``hb.phase`` ("preparing data and model", "step 37/4690", "closing Ray / writing report").
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Heartbeat", "StepTracker"]


class Heartbeat:
    def __init__(self, prefix: str, phase: str = "starting", every: float = 10.0,
                 stream: TextIO | None = None) -> None:
        self.prefix, self.phase, self.every = prefix, phase, every
        self.stream = stream
        self._t0 = self._last = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="heartbeat")

    # Tune pickles its callbacks (the progress line's printer says things through this): the
    # lock, the thread and the stream stay behind, a copy gets fresh inert ones.
    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        for k in ("_lock", "_thread", "_stop"):
            d.pop(k)
        d["stream"] = None
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="heartbeat")

    def say(self, line: str) -> None:
        with self._lock:
            print(line, file=self.stream or sys.stdout, flush=True)
            self._last = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self.every / 4)):
            now = time.monotonic()
            if now - self._last >= self.every:
                elapsed = now - self._t0
                self.say(f"[{self.prefix}] still working: {self.phase} ({elapsed:.0f}s elapsed)")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class StepTracker:
    """A StepMonitor proxy: records the step reached (for the heartbeat) and delegates to
    ``inner`` (a DivergenceMonitor, or None: never stops)."""

    def __init__(self, inner: Any, hb: Heartbeat, total: int) -> None:
        self._inner, self._hb, self._total = inner, hb, total
        self._t0: float | None = None

    def check(self, info: Any):
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
            rate = ""
        else:
            rate = f", {(now - self._t0) / max(1, info.step - 1):.2f} s/step"
        self._hb.phase = f"training: step {info.step}/{self._total}{rate}"
        return None if self._inner is None else self._inner.check(info)

    def state_dict(self) -> dict:
        return {} if self._inner is None else self._inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self._inner is not None:
            self._inner.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:  # signals / check_eval only when inner has them
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)
