"""``orchestrator.analysis.stats`` against scipy and hand-computed references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from orchestrator.analysis.stats import (
    holm,
    paired_difference,
    spike_count,
    t_interval,
    wilson_interval,
)


def _wilson_reference(k: int, n: int, conf: float) -> tuple[float, float]:
    # Wilson (1927): (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z = st.norm.ppf(1 - (1 - conf) / 2)
    p = k / n
    c = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    h = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return c - h, c + h


@pytest.mark.parametrize("conf", [0.9, 0.95, 0.99])
@pytest.mark.parametrize("values", [[3.0, 3.1, 2.95, 3.05], [1.0, 2.0], [0.3, 0.1, 0.7, 0.2, 0.9]])
def test_t_interval_matches_scipy(values, conf):
    x = np.array(values)
    ref = st.t.interval(conf, len(x) - 1, loc=x.mean(), scale=st.sem(x))
    mean, lo, hi = t_interval(values, conf)
    assert mean == pytest.approx(x.mean(), abs=1e-12)
    assert (lo, hi) == pytest.approx(ref, abs=1e-12)


def test_t_interval_edge_cases():
    m, lo, hi = t_interval([2.5])
    assert m == 2.5 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(v) for v in t_interval([]))
    assert t_interval([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)  # zero spread: zero width
    # non-finite values (diverged trials) are dropped
    assert t_interval([1.0, 2.0, float("nan"), float("inf")]) == pytest.approx(t_interval([1, 2]))


@pytest.mark.parametrize("k,n", [(0, 4), (1, 4), (2, 4), (4, 4), (3, 17), (40, 100), (1, 1)])
@pytest.mark.parametrize("conf", [0.9, 0.95])
def test_wilson_matches_formula(k, n, conf):
    p, lo, hi = wilson_interval(k, n, conf)
    assert p == pytest.approx(k / n)
    assert (lo, hi) == pytest.approx(_wilson_reference(k, n, conf), abs=1e-12)
    assert 0.0 <= lo <= p <= hi <= 1.0


def test_wilson_known_value_and_errors():
    # 2 of 4 at 95%: the classical value (0.150, 0.850)
    _, lo, hi = wilson_interval(2, 4)
    assert (lo, hi) == pytest.approx((0.15004, 0.84996), abs=1e-5)
    assert wilson_interval(0, 0)[1:] == (0.0, 1.0)
    with pytest.raises(ValueError, match="k <= n"):
        wilson_interval(5, 4)


def test_holm_hand_example():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> cummax
    adj = holm([0.01, 0.04, 0.03, 0.005])
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_caps_at_one_keeps_nan_and_is_monotone():
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    adj = holm([float("nan"), 0.02, 0.04])  # m = 2: nan is not a test
    assert math.isnan(adj[0]) and adj[1:] == pytest.approx([0.04, 0.04])
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, 12)
    a = np.array(holm(p))
    order = np.argsort(p)
    assert np.all(np.diff(a[order]) >= 0) and np.all(a >= p) and np.all(a <= 1)
    assert holm([]) == []


def test_paired_difference_matches_scipy():
    a = [2.90, 2.98, 2.87, 2.94]
    b = [3.00, 3.10, 2.95, 3.05]
    r = paired_difference(a, b)
    d = np.subtract(a, b)
    assert r.n == 4 and r.mean == pytest.approx(d.mean())
    assert (r.lo, r.hi) == pytest.approx(st.t.interval(0.95, 3, loc=d.mean(), scale=st.sem(d)))
    assert r.p == pytest.approx(st.ttest_rel(a, b).pvalue)
    assert r.p == pytest.approx(2 * st.t.sf(abs(d.mean() / st.sem(d)), 3))


def test_paired_difference_pairs_by_seed_key():
    a = {3: 2.94, 0: 2.90, 1: 2.98, 2: 2.87, 7: 1.0}  # seed 7 has no partner
    b = {0: 3.00, 1: 3.10, 2: 2.95, 3: 3.05, 5: 9.0}
    r = paired_difference(a, b)
    ref = paired_difference([2.90, 2.98, 2.87, 2.94], [3.00, 3.10, 2.95, 3.05])
    assert r == ref
    # a pair with a non-finite side drops out
    r2 = paired_difference([1.0, 2.0, float("nan"), 4.0], [0.5, 1.0, 1.0, 3.0])
    assert r2.n == 3 and r2.mean == pytest.approx(np.mean([0.5, 1.0, 1.0]))


def test_paired_difference_degenerate():
    r = paired_difference([2.0, 3.0], [1.0, 2.0])  # constant difference: t = inf
    assert r.mean == 1.0 and r.p == 0.0 and (r.lo, r.hi) == (1.0, 1.0)
    assert paired_difference([1.0, 2.0], [1.0, 2.0]).p == 1.0
    one = paired_difference([1.0], [0.5])
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.p)
    with pytest.raises(ValueError, match="lengths differ"):
        paired_difference([1.0, 2.0], [1.0])


def _noisy_curve(n=600, seed=0):
    """MNIST-like batch losses: 2.3 -> 0.1 with multiplicative batch noise (sd ~30%)."""
    rng = np.random.default_rng(seed)
    trend = 0.1 + 2.2 * np.exp(-np.arange(n) / 60.0)
    return list(trend * np.exp(rng.normal(0.0, 0.3, n)))


def test_spike_count_ignores_batch_noise():
    losses = _noisy_curve()
    # the old running-minimum reference counted the batch noise as dozens of spike episodes
    run_min, old = np.minimum.accumulate(losses), 0
    above = [v > 1.5 * m and v > m + 0.1 for v, m in zip(losses[1:], run_min[:-1])]
    old = sum(1 for i, a in enumerate(above) if a and (i == 0 or not above[i - 1]))
    assert old > 20
    assert spike_count(losses, 1.5, 0.1) == 0


def test_spike_count_episodes():
    base = [3.0, 3.1] * 20  # median 3.05, MAD 0.05: bound max(1.5 x 3.05, 3.05 + 0.445)
    losses = base + [5.0, 6.0, 5.0] + base[:10] + [4.8] + base[:10]
    assert spike_count(losses, 1.5) == 2  # one 3-step episode, one single step
    assert spike_count(losses, 2.0) == 0  # 6.0 < 2 x 3.05
    assert spike_count(base + [float("nan")], 1.5) == 1  # blow-up to nan is a spike
    assert spike_count([float("inf")] + base, 1.5) == 0  # no history yet
    assert spike_count(base[:5] + [float("nan")], 1.5) == 0  # history shorter than 10
    tiny = [0.01, 0.012] * 10 + [0.05]  # 4x the median, but 0.04 is noise on a tiny loss
    assert spike_count(tiny, 2.0) == 1
    assert spike_count(tiny, 2.0, min_delta=0.1) == 0
    assert spike_count([], 2.0) == 0
    with pytest.raises(ValueError, match="factor"):
        spike_count([1.0], 1.0)
    with pytest.raises(ValueError, match="window"):
        spike_count([1.0], 2.0, window=2)


def test_mde_matches_formula_and_shrinks_with_n():
    from orchestrator.analysis.stats import mde

    # n = 5 per arm, df = 8: t_{0.975,8} = 2.306004, t_{0.8,8} = 0.888890
    assert mde(1.0, 5) == pytest.approx((2.306004 + 0.888890) * math.sqrt(2 / 5), rel=1e-5)
    assert mde(0.5, 5) == pytest.approx(0.5 * mde(1.0, 5))
    assert mde(1.0, 8) < mde(1.0, 4) < mde(1.0, 2)
    # large n: the normal limit (1.959964 + 0.841621) * sqrt(2/n)
    assert mde(1.0, 20000) == pytest.approx(2.801585 * math.sqrt(2 / 20000), rel=1e-3)
    assert mde(1.0, 1) == math.inf
    assert mde(0.0, 4) == 0.0
    with pytest.raises(ValueError, match="alpha"):
        mde(1.0, 4, alpha=1.5)


def test_welch_matches_scipy():
    from orchestrator.analysis.stats import welch

    a, b = [2.0, 2.2, 2.1, 2.4], [2.5, 2.9, 2.6]
    r = welch(a, b)
    ref = st.ttest_ind(a, b, equal_var=False)
    assert r.p == pytest.approx(ref.pvalue)
    assert r.mean == pytest.approx(np.mean(a) - np.mean(b))
    ci = ref.confidence_interval(0.95)
    assert (r.lo, r.hi) == pytest.approx((ci.low, ci.high))
    assert math.isnan(welch([1.0], b).p) and welch([1.0, 1.0], [1.0, 1.0]).p == 1.0


def test_mde_unequal_arms_and_pooled_sd():
    """mde with nb: df na + nb - 2 and the factor sqrt(1/na + 1/nb); nb = n is the old form."""
    from orchestrator.analysis.stats import mde, pooled_sd

    assert mde(1.0, 5, nb=5) == mde(1.0, 5)
    import scipy.stats as st
    want = (st.t.ppf(0.975, 6) + st.t.ppf(0.8, 6)) * math.sqrt(1 / 3 + 1 / 5)
    assert mde(1.0, 3, nb=5) == pytest.approx(want, rel=1e-12)
    assert mde(1.0, 5, nb=1) == math.inf
    assert pooled_sd(1.0, 3, 1.0, 5) == pytest.approx(1.0)
    assert pooled_sd(1.0, 3, 2.0, 3) == pytest.approx(math.sqrt(2.5))
    assert math.isnan(pooled_sd(1.0, 1, 2.0, 3))
