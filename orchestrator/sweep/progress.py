"""The sweep's progress line: one compact line every few seconds instead of Tune's tables.

One clock: "elapsed" is the time since the command started (the process's start, as the
heartbeat's "still working ... (Ns elapsed)" lines count it), not since Tune's first step.

The ETA is there from a trial's first report, not only after the first trial ends: work is
counted in training steps (each result says the step it reached and the trial's budget,
``_budget``), a trial that ended (completed, stopped, diverged, failed) counts its whole budget
as done (its slot is free), and the rate so far (steps per second since the first trial
started) gives the time the remaining steps take. ASHA stopping trials early makes it
pessimistic; it shrinks as trials end.

A resumed sweep: the trials that were over before this driver started count as done, but
not toward the rate (their steps took none of this driver's time), and the best value and the
diverged count include them (read from what Tune restored of their last result).
"""

from __future__ import annotations

import math
import os
import time

__all__ = ["make_progress", "command_start", "eta_seconds"]


def command_start() -> float:
    """Unix time the current process started (Linux: /proc), else the first call's time."""
    global _START
    if _START is None:
        try:
            with open("/proc/self/stat") as f:
                ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            with open("/proc/stat") as f:
                boot = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
            _START = boot + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, StopIteration):
            _START = time.time()
    return _START


_START: float | None = None


def eta_seconds(total: int, budget: float | None, reached: dict[str, float],
                ended: set[str], work_s: float, before: set[str] = frozenset()) -> float | None:
    """Seconds left, from steps done per second so far (None: nothing to go on yet).
    ``reached``: trial -> step reached; ``ended``: trials that are over (their budget done);
    ``before``: the ended trials that were over before ``work_s`` began (a resume's: done,
    but no part of the rate)."""
    if not budget or work_s <= 0:
        return None
    done = sum(budget if t in ended else min(s, budget) for t, s in reached.items())
    done += budget * len(ended - set(reached))
    now = done - budget * len(before & ended)
    if now <= 0:
        return None
    left = total * budget - done
    return max(0.0, left / (now / work_s))


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
            self.t0 = command_start()
            self.t_first: float | None = None  # the first trial's start: work time from here
            self.last = 0.0
            self.best: float | None = None
            self.diverged: set[str] = set()
            self.reached: dict[str, float] = {}
            self.budget: float | None = None
            self.before: set[str] | None = None  # trials over when this driver first looked

        def _restored(self, trials) -> None:
            """Once, before any trial of this driver ends: a resume's finished trials."""
            if self.before is not None:
                return
            self.before = set()
            for t in trials:
                if t.status not in ("TERMINATED", "ERROR"):
                    continue
                self.before.add(t.trial_id)
                self._count(t.trial_id, getattr(t, "last_result", None) or {})

        def _count(self, trial_id: str, result: dict) -> None:
            if result.get("_budget"):
                self.budget = float(result["_budget"])
            if result.get("_status") == "diverged":
                self.diverged.add(trial_id)
                return
            v = result.get(self.metric)
            if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
                return
            if self.best is None or (v < self.best if self.mode == "min" else v > self.best):
                self.best = v

        def on_step_begin(self, iteration, trials, **info):
            self._restored(trials)

        def on_trial_start(self, iteration, trials, trial, **info):
            self._restored(trials)
            if self.t_first is None:
                self.t_first = time.time()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self._restored(trials)
            if self.t_first is None:
                self.t_first = time.time()
            if result.get("step") is not None:
                self.reached[trial.trial_id] = float(result["step"])
            self._count(trial.trial_id, result)

        def on_step_end(self, iteration, trials, **info):
            self._restored(trials)
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
            now = time.time()
            elapsed = now - self.t0
            total = max(self.total, len(trials))
            ended = {t.trial_id for t in trials if t.status in ("TERMINATED", "ERROR")}
            work = now - self.t_first if self.t_first is not None else 0.0
            left = eta_seconds(total, self.budget, self.reached, ended, work,
                               self.before or set())
            if done + failed >= total:
                left = 0.0
            eta = "?" if left is None else f"{left:.0f}s"
            best = "-" if self.best is None else f"{self.best:.4f}"
            return (f"[geosweep] {done}/{total} done, {running} running, {div} diverged, "
                    f"{failed} failed | best {self.label} {best} | {elapsed:.0f}s elapsed, "
                    f"ETA {eta}")

    return ProgressCallback
