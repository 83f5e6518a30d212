"""The sweep's progress line: one compact line every few seconds instead of Tune's tables."""

from __future__ import annotations

import math
import time

__all__ = ["make_progress"]


def make_progress():
    """The progress-line Tune callback class (built lazily: it subclasses ray.tune.Callback)."""
    import ray.tune

    class ProgressCallback(ray.tune.Callback):
        """One compact progress line every few seconds instead of Tune's tables."""

        def __init__(self, total: int, metric: str, mode: str, every_s: float = 5.0,
                     printer=print, label: str | None = None):
            self.total, self.metric, self.mode = total, metric, mode
            self.label = label or metric
            self.every_s, self.printer = every_s, printer
            self.t0 = time.time()
            self.last = 0.0
            self.best: float | None = None
            self.diverged: set[str] = set()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get("_status") == "diverged":
                self.diverged.add(trial.trial_id)
                return
            v = result.get(self.metric)
            if v is None or not math.isfinite(v):
                return
            if self.best is None or (v < self.best if self.mode == "min" else v > self.best):
                self.best = v

        def on_step_end(self, iteration, trials, **info):
            now = time.time()
            if now - self.last >= self.every_s:
                self.last = now
                self.printer(self.line(trials))

        def on_experiment_end(self, trials, **info):
            self.printer(self.line(trials))

        def line(self, trials) -> str:
            st = [t.status for t in trials]
            done = sum(s == "TERMINATED" for s in st)
            running = sum(s == "RUNNING" for s in st)
            failed = sum(s == "ERROR" for s in st)
            div = len(self.diverged)
            elapsed = time.time() - self.t0
            total = max(self.total, len(trials))
            eta = "?"
            if done + failed:
                eta = f"{elapsed / (done + failed) * (total - done - failed):.0f}s"
            best = "-" if self.best is None else f"{self.best:.4f}"
            return (f"[geosweep] {done}/{total} done, {running} running, {div} diverged, "
                    f"{failed} failed | best {self.label} {best} | {elapsed:.0f}s elapsed, "
                    f"ETA {eta}")

    return ProgressCallback
