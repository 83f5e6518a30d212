"""``spike_count`` for many long curves, exactly, without a Python step per point.

``orchestrator.analysis.stats.spike_count`` walks a curve step by step (a median of the last
``window`` non-spiking losses at every step): 10,000 steps x 1,000 trials is minutes. Until a
curve's first spike its reference window is simply its last ``window`` finite values, whose
median is at least their minimum; so a step can only be the first spike if it is non-finite
or above ``factor`` x the minimum of the previous ``window`` finite values. That test is
vectorised over all curves at once (``first_candidates``); ``spike_count``'s loop then runs
only from each curve's first such candidate on, with its window preloaded, so the count is
exactly ``spike_count``'s (tests/orchestrator/analysis/test_fast_spikes.py compares them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orchestrator.analysis.spike_rule import SPIKE_FACTOR, SPIKE_MIN_DELTA, spike_rule
from orchestrator.analysis.stats import spike_episodes

__all__ = ["first_candidate", "first_candidates", "fast_spike_count", "spike_counts",
           "recorded_spikes"]


def recorded_spikes(train_losses: list[float], steps: list[int] | None = None
                    ) -> tuple[int | None, str]:
    """A finished trial's ``(spikes, spikes_rule)`` under the default rule (None: no curve, or
    a sampled one: ``steps`` with a gap, a sweep with ``budget.curve_every`` > 1, where a spike
    between two samples would go unseen and the rule's window would not be in steps); missing
    losses count as non-finite, as in the report."""
    sampled = steps is not None and any(b - a > 1 for a, b in zip(steps, steps[1:]))
    if not train_losses or sampled:
        return None, spike_rule(SPIKE_FACTOR, SPIKE_MIN_DELTA)
    v = np.asarray(train_losses, dtype=float)
    v[np.isnan(v)] = np.inf
    return (fast_spike_count(v, SPIKE_FACTOR, SPIKE_MIN_DELTA),
            spike_rule(SPIKE_FACTOR, SPIKE_MIN_DELTA))


def _prev_window_min(ref: np.ndarray, pos: np.ndarray, window: int) -> np.ndarray:
    """min of ``ref[max(i - window, group start) : i]`` at every i (+inf: nothing before).

    ``pos`` is each row's index inside its group. Doubling: ``w[i]`` = min of the last ``2**k``
    values up to i inside the group; a window of ``window`` values is the union of two
    overlapping windows of ``2**k <= window`` (min is exact, so overlap does not matter).
    """
    w, size = ref.copy(), 1
    while 2 * size <= window:
        back = np.full_like(w, np.inf)
        back[size:] = w[:-size]
        back[pos < size] = np.inf  # the window would cross into the previous group
        np.minimum(w, back, out=w)
        size *= 2
    # w[e] covers [e - size + 1, e]; add [e - window + 1, e - window + size] for e = i - 1
    shift = window - size
    full = w
    if shift:
        far = np.full_like(w, np.inf)
        far[shift:] = w[:-shift]
        far[pos < shift] = np.inf
        full = np.minimum(w, far)
    out = np.full_like(ref, np.inf)
    out[1:] = full[:-1]
    out[pos == 0] = np.inf
    return out


def first_candidates(starts: np.ndarray, ends: np.ndarray, v: np.ndarray, factor: float,
                     window: int = 30, min_history: int = 10) -> np.ndarray:
    """Per group ``v[starts[g]:ends[g]]``: the index (into ``v``) of its first step that could
    spike, -1 where the curve never spikes. Groups are contiguous and cover ``v``."""
    v = np.asarray(v, dtype=float)
    found = np.full(len(starts), -1, dtype=np.int64)
    if not len(v):
        return found
    lengths = ends - starts
    pos = np.arange(len(v)) - np.repeat(starts, lengths)
    fin = np.isfinite(v)
    csum = np.cumsum(fin) - fin  # finite values before each row, over the whole array
    n_before = csum - np.repeat(csum[starts], lengths)
    # before a group's first non-finite value (itself a candidate, or an early fallback)
    # its finite values are all its values: +inf stands for non-finite, later rows may differ
    # from spike_count's window but never come before the first candidate
    roll = _prev_window_min(np.where(fin, v, np.inf), pos, window)
    ok = n_before >= min_history
    with np.errstate(invalid="ignore", over="ignore"):
        cand = ok & (~fin | (v > factor * roll))
    # a non-finite value before min_history makes positional windows != finite windows:
    # it is a stop too (still exact: spike_count runs from there)
    hits = np.flatnonzero(cand | (~fin & ~ok))
    h = np.searchsorted(hits, starts)
    inside = h < len(hits)
    inside[inside] &= hits[h[inside]] < ends[inside]
    found[inside] = hits[h[inside]]
    return found


def first_candidate(v: np.ndarray, factor: float, window: int = 30,
                    min_history: int = 10) -> int | None:
    """Index of the first step that could spike (None: the curve never spikes)."""
    v = np.asarray(v, dtype=float)
    c = first_candidates(np.array([0]), np.array([len(v)]), v, factor, window, min_history)
    return None if c[0] < 0 else int(c[0])


def fast_spike_count(v, factor: float, min_delta: float = 0.0, *, window: int = 30,
                     z: float = 6.0, min_history: int = 10) -> int:
    """``spike_count(v, ...)``, computed from the first candidate step on."""
    v = np.asarray(v, dtype=float)
    c = first_candidate(v, factor, window, min_history)
    return 0 if c is None else _count_from(v[:c], v[c:], factor, min_delta, window, z,
                                           min_history)


def _count_from(head: np.ndarray, rest: np.ndarray, factor: float, min_delta: float,
                window: int, z: float, min_history: int) -> int:
    """spike_count's own loop on ``rest``, its window preloaded from ``head`` (the values
    before the first candidate: none of them spiked)."""
    before = head[np.isfinite(head)][-window:]
    return spike_episodes(rest.tolist(), before.tolist(), factor, min_delta, window, z,
                          min_history)


def spike_counts(trial: np.ndarray, values: np.ndarray, factor: float,
                 min_delta: float = 0.0) -> pd.Series:
    """trial -> spike count, for rows already sorted by (trial, step)."""
    trial = np.asarray(trial)
    if len(trial) == 0:
        return pd.Series(dtype=float)
    values = np.asarray(values, dtype=float)
    cut = np.flatnonzero(trial[1:] != trial[:-1]) + 1
    starts = np.concatenate([[0], cut]).astype(np.int64)
    ends = np.concatenate([cut, [len(trial)]]).astype(np.int64)
    first = first_candidates(starts, ends, values, factor)
    counts = np.zeros(len(starts))
    for g in np.flatnonzero(first >= 0):  # only curves that may spike run the exact loop
        a, c, b = starts[g], first[g], ends[g]
        counts[g] = _count_from(values[a:c], values[c:b], factor, min_delta, 30, 6.0, 10)
    return pd.Series(counts, index=[str(t) for t in trial[starts]], dtype=float)
