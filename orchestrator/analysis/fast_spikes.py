"""``spike_count`` for many long curves, exactly, without a Python step per point.

``orchestrator.analysis.stats.spike_count`` walks a curve step by step (a median of the last
``window`` non-spiking losses at every step): 10,000 steps x 1,000 trials is minutes. Until a
curve's first spike its reference window is simply its last ``window`` finite values, whose
median is at least their minimum; so a step can only be the first spike if it is non-finite
or above ``factor`` x the rolling minimum of the previous ``window`` finite values. That test
is vectorised; ``spike_count``'s loop then runs only from the first such candidate on, with
its window preloaded, so the count is exactly ``spike_count``'s (tests/orchestrator/
analysis/test_fast_spikes.py compares them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orchestrator.analysis.stats import spike_episodes

__all__ = ["first_candidate", "fast_spike_count", "spike_counts"]


def first_candidate(v: np.ndarray, factor: float, window: int = 30,
                    min_history: int = 10) -> int | None:
    """Index of the first step that could spike (None: the curve never spikes)."""
    fin = np.isfinite(v)
    n_before = np.cumsum(fin) - fin  # finite values before each step
    ref = np.where(fin, v, np.nan)
    # rolling minimum of the previous `window` finite values: before the first non-finite
    # value after min_history (itself a candidate) the finite values are the whole curve
    roll = pd.Series(ref).rolling(window, min_periods=1).min().shift(1).to_numpy()
    ok = n_before >= min_history
    cand = ok & (~fin | (v > factor * roll))
    idx = np.flatnonzero(cand)
    # a non-finite value before min_history makes positional windows != finite windows:
    # fall back to the first such value (still exact: spike_count runs from there)
    early_nan = np.flatnonzero(~fin & ~ok)
    first = [int(i) for i in (idx[:1].tolist() + early_nan[:1].tolist())]
    return min(first) if first else None


def fast_spike_count(v, factor: float, min_delta: float = 0.0, *, window: int = 30,
                     z: float = 6.0, min_history: int = 10) -> int:
    """``spike_count(v, ...)``, computed from the first candidate step on."""
    v = np.asarray(v, dtype=float)
    c = first_candidate(v, factor, window, min_history)
    if c is None:
        return 0
    before = v[:c][np.isfinite(v[:c])][-window:]  # spike_count's window at step c
    return _count_from(before, v[c:], factor, min_delta, window, z, min_history)


def _count_from(before: np.ndarray, rest: np.ndarray, factor: float, min_delta: float,
                window: int, z: float, min_history: int) -> int:
    """spike_count's own loop, its window preloaded with ``before``."""
    return spike_episodes(rest.tolist(), before.tolist(), factor, min_delta, window, z,
                          min_history)


def spike_counts(trial: np.ndarray, values: np.ndarray, factor: float,
                 min_delta: float = 0.0) -> pd.Series:
    """trial -> spike count, for rows already sorted by (trial, step)."""
    trial = np.asarray(trial)
    if len(trial) == 0:
        return pd.Series(dtype=float)
    cut = np.flatnonzero(trial[1:] != trial[:-1]) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(trial)]])
    return pd.Series({str(trial[a]): fast_spike_count(values[a:b], factor, min_delta)
                      for a, b in zip(starts, ends)}, dtype=float)
