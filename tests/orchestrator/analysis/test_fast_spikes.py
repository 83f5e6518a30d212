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
