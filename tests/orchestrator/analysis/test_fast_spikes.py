"""fast_spike_count == stats.spike_count on curves with and without spikes."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.analysis.fast_spikes import fast_spike_count, first_candidate, spike_counts
from orchestrator.analysis.stats import spike_count


def _curves():
    rng = np.random.default_rng(0)
    base = 2.0 + 3.0 * np.exp(-np.arange(2000) / 200.0)
    for k in range(12):
        v = base + rng.normal(0, 0.05, base.size)
        for at in rng.integers(20, 1990, k):  # k spikes, some adjacent
            v[at:at + int(rng.integers(1, 4))] *= float(rng.uniform(1.6, 8.0))
        if k % 4 == 1:
            v[int(rng.integers(100, 1900))] = np.nan
        if k % 4 == 2:
            v[-30:] = np.linspace(v[-31], 50.0, 30)  # a diverging tail
        if k % 4 == 3:
            v[3] = np.inf  # non-finite before the history is long enough
        yield v


@pytest.mark.parametrize("factor, delta", [(1.5, 0.1), (1.2, 0.0), (3.0, 0.5)])
def test_equals_spike_count(factor, delta):
    counts = []
    for v in _curves():
        exact = spike_count(v, factor, delta)
        assert fast_spike_count(v, factor, delta) == exact
        counts.append(exact)
    assert max(counts) >= 3  # the curves do spike: the comparison is not all zeros


def test_healthy_curve_has_no_candidate_and_grouping():
    v = 2.0 + np.exp(-np.arange(500) / 50.0)
    assert first_candidate(v, 1.5) is None and fast_spike_count(v, 1.5, 0.1) == 0
    w = v.copy()
    w[300] = 10.0
    trial = np.array(["a"] * 500 + ["b"] * 500)
    out = spike_counts(trial, np.concatenate([v, w]), 1.5, 0.1)
    assert out.to_dict() == {"a": 0.0, "b": 1.0}


def _random_curves(seed: int):
    """Short random curves: plateaus (ties), jumps, NaN/inf anywhere, lengths around the
    window and min_history."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(0, 120))
        v = np.round(rng.uniform(1.0, 3.0, n), int(rng.integers(0, 3)))  # rounding: ties
        if n and rng.uniform() < 0.5:
            v[rng.integers(0, n, int(rng.integers(1, 6)))] *= rng.uniform(1.0, 10.0)
        if n and rng.uniform() < 0.4:
            v[rng.integers(0, n, int(rng.integers(1, 3)))] = rng.choice([np.nan, np.inf, -np.inf])
        yield v


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("factor, delta", [(1.5, 0.1), (1.05, 0.0)])
def test_random_curves_grouped_equal_spike_count(seed, factor, delta):
    curves = list(_random_curves(seed))
    exact = [spike_count(v, factor, delta) for v in curves]
    assert [fast_spike_count(v, factor, delta) for v in curves] == exact
    keep = [i for i, v in enumerate(curves) if len(v)]  # a group has at least one row
    trial = np.concatenate([np.full(len(curves[i]), i) for i in keep])
    out = spike_counts(trial, np.concatenate([curves[i] for i in keep]), factor, delta)
    assert out.to_dict() == {str(i): float(exact[i]) for i in keep}
    assert sum(exact) > 10 and exact.count(0) > 5  # both outcomes are exercised


def test_first_candidates_match_rolling_minimum_reference():
    """The vectorised candidate test = a pandas rolling minimum per curve (its definition)."""
    import pandas as pd

    from orchestrator.analysis.fast_spikes import first_candidates

    for v in _random_curves(7):
        if not len(v):
            continue
        fin = np.isfinite(v)
        roll = pd.Series(np.where(fin, v, np.nan)).rolling(30, min_periods=1).min().shift(1)
        ok = (np.cumsum(fin) - fin) >= 10
        hits = np.flatnonzero((ok & (~fin | (v > 1.5 * roll.to_numpy()))) | (~fin & ~ok))
        got = first_candidates(np.array([0]), np.array([len(v)]), v, 1.5)[0]
        assert got == (hits[0] if len(hits) else -1)
