"""A progress line when a long command would otherwise be silent.

``Heartbeat`` runs a daemon thread that prints ``[prefix] <what is happening> (Ns)`` whenever
nothing was printed through it for ``every`` seconds (N: seconds since the command started,
the clock of the sweep's progress line too: orchestrator/sweep/progress.py); commands print
through ``hb.say`` and set ``hb.phase`` ("preparing data and model", "step 37/4690", "closing
Ray / writing report").
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
        from orchestrator.sweep.progress import command_start

        self.prefix, self.phase, self.every = prefix, phase, every
        self.stream = stream
        self._last = time.monotonic()
        # one clock with the sweep's progress line: elapsed since the command started
        self._t0 = self._last - max(0.0, time.time() - command_start())
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
    ``inner`` (a DivergenceMonitor, or None: never stops). The loop asks it right after each
    optimizer step, before that step's evaluation and metrics: at a step that ends with them
    (``eval_every``, ``metrics_every``, the last) the phase says so, not "step 30/30" while the
    validation set is scored."""

    def __init__(self, inner: Any, hb: Heartbeat, total: int, eval_every: int = 0,
                 metrics_every: int = 0) -> None:
        self._inner, self._hb, self._total = inner, hb, total
        self._eval, self._metrics = eval_every, metrics_every
        self._t0: float | None = None

    def check(self, info: Any):
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
            rate = ""
        else:
            rate = f", {(now - self._t0) / max(1, info.step - 1):.2f} s/step"
        n, last = info.step, info.step == self._total
        evaluates = last or (self._eval and n % self._eval == 0)
        metrics = self._metrics and (last or n % self._metrics == 0)
        if evaluates or metrics:
            what = " and ".join(w for w, on in (("evaluating on the validation set", evaluates),
                                                 ("collecting metrics", metrics)) if on)
            self._hb.phase = f"{what} after step {n}/{self._total}"
        else:
            self._hb.phase = f"training: step {n}/{self._total}{rate}"
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
