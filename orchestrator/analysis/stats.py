"""Small-sample statistics for ablation tables: pure functions of numbers, no I/O.

- ``t_interval``: Student-t confidence interval of a mean over seeds.
- ``wilson_interval``: Wilson score interval of a rate (divergences / trials); unlike the
  normal approximation it stays inside [0, 1] and is sensible at k = 0 or k = n.
- ``holm``: Holm step-down adjustment of p-values (family-wise error over arms).
- ``paired_difference``: paired t-test of a - b over shared seeds (same data order and init
  per seed, so pairing removes the seed-to-seed variance shared by both arms).
- ``spike_count``: loss-spike episodes of one curve (median/MAD over a window).
- ``welch``: Welch's unpaired two-sample t comparison of a - b (unequal variances).
- ``mde``: minimum detectable effect of a two-sample comparison with n seeds per arm.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PairedResult",
    "t_interval",
    "wilson_interval",
    "holm",
    "pooled_sd",
    "paired_difference",
    "spike_count",
    "mde",
    "welch",
]


def _st():
    """scipy.stats, imported on first use: the sweep driver imports this module for the spike
    count of a finished trial (analysis/fast_spikes.py) and needs none of it (~1 s)."""
    from scipy import stats

    return stats


NAN = float("nan")


def _finite(values: Iterable[float]) -> np.ndarray:
    x = np.asarray(list(values), dtype=float)
    return x[np.isfinite(x)]


def t_interval(values: Iterable[float], conf: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of the t-interval over the finite values; n = 1 -> nan bounds.

    Non-finite values (a diverged trial's nan/inf) are dropped: callers pass completed trials
    and count divergences separately.
    """
    x = _finite(values)
    n = len(x)
    if n == 0:
        return NAN, NAN, NAN
    mean = float(x.mean())
    if n == 1:
        return mean, NAN, NAN
    # half-width by hand so a zero spread gives a zero-width interval (scipy returns nan)
    half = float(_st().t.ppf(0.5 + conf / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half


def wilson_interval(k: int, n: int, conf: float = 0.95) -> tuple[float, float, float]:
    """(k/n, lo, hi) of the Wilson score interval; n = 0 -> (nan, 0, 1), nothing known."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson_interval: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return NAN, 0.0, 1.0
    z = float(_st().norm.ppf(0.5 + conf / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the bounds are exactly 0 at k = 0 and 1 at k = n; say so rather than round near them
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return p, lo, hi


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order; nan stays nan and is not counted.

    Sorted p_(1) <= ... <= p_(m): adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).
    """
    p = np.asarray(list(pvalues), dtype=float)
    out = np.full(p.shape, NAN)
    idx = np.flatnonzero(~np.isnan(p))
    m = len(idx)
    if m == 0:
        return out.tolist()
    order = idx[np.argsort(p[idx], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out.tolist()


@dataclass(frozen=True)
class PairedResult:
    """Paired difference a - b: mean, t-interval, two-sided paired t-test p-value."""

    n: int
    mean: float
    lo: float
    hi: float
    p: float


def _pairs(a, b) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(a, "to_dict"):  # pandas Series indexed by seed
        a = a.to_dict()
    if hasattr(b, "to_dict"):
        b = b.to_dict()
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = [k for k in a if k in b]
        x = np.array([a[k] for k in keys], dtype=float)
        y = np.array([b[k] for k in keys], dtype=float)
    else:
        x, y = np.asarray(list(a), dtype=float), np.asarray(list(b), dtype=float)
        if x.shape != y.shape:
            raise ValueError(f"paired_difference: lengths differ ({len(x)} vs {len(y)})")
    ok = np.isfinite(x) & np.isfinite(y)
    return x[ok], y[ok]


def paired_difference(a, b, conf: float = 0.95) -> PairedResult:
    """a - b paired by seed. ``a``/``b``: mappings (or Series) seed -> value, paired on shared
    keys, or equal-length sequences paired by position. Pairs with a non-finite side drop out.
    """
    x, y = _pairs(a, b)
    d = x - y
    n = len(d)
    mean, lo, hi = t_interval(d, conf)
    if n < 2:
        return PairedResult(n, mean, lo, hi, NAN)
    if float(d.std(ddof=1)) == 0.0:  # t is +-inf (or 0/0): the limit of the test
        return PairedResult(n, mean, lo, hi, 1.0 if mean == 0.0 else 0.0)
    p = float(_st().ttest_rel(x, y).pvalue)
    return PairedResult(n, mean, lo, hi, p)


def spike_count(losses: Iterable[float], factor: float, min_delta: float = 0.0, *,
                window: int = 30, z: float = 6.0, min_history: int = 10) -> int:
    """Number of loss-spike episodes in a step-ordered curve, by a robust local statistic.

    Step t spikes when loss_t > factor x med_t and loss_t > med_t + max(z x 1.4826 x MAD_t,
    min_delta), with med_t and MAD_t the median and median absolute deviation of the last
    ``window`` non-spiking finite losses before t
    (``orchestrator.spec.divergence_rules.spike_bound``);
    a non-finite loss after ``min_history`` finite ones also spikes. Consecutive spiking steps
    form one episode. The old reference, the running minimum, counted every noisy batch above
    the luckiest one seen (~300 "spikes" in a healthy MNIST trial, issue 17); a median over a
    window moves with the decreasing loss, and the MAD scales the bound to the batch noise.
    """
    if factor <= 1.0:
        raise ValueError(f"spike_count: factor must be > 1, got {factor}")
    if window < 5 or min_history < 1:
        raise ValueError(f"spike_count: need window >= 5 and min_history >= 1, got {window}, "
                         f"{min_history}")
    return spike_episodes(losses, (), factor, min_delta, window, z, min_history)


def spike_episodes(losses: Iterable[float], before: Iterable[float], factor: float,
                   min_delta: float, window: int, z: float, min_history: int) -> int:
    """``spike_count``'s loop, its reference window preloaded with ``before`` (the finite
    non-spiking losses that precede ``losses``; analysis/fast_spikes.py starts mid-curve)."""
    from orchestrator.spec.divergence_rules import spike_bound

    recent: deque[float] = deque((float(b) for b in before), maxlen=window)
    count, inside = 0, False
    for v in losses:
        v = float(v)
        spiking = False
        if len(recent) >= min_history:
            if not math.isfinite(v):
                spiking = True
            else:
                med = float(np.median(recent))
                spiking = v > factor * med and v > spike_bound(recent, z, min_delta)
        if spiking and not inside:
            count += 1
        inside = spiking
        if math.isfinite(v) and not spiking:  # spikes stay out of the reference window
            recent.append(v)
    return count


def mde(s: float, n: int, alpha: float = 0.05, power: float = 0.8,
        df: float | None = None, nb: int | None = None) -> float:
    """Minimum detectable effect of a two-sided, two-sample t comparison.

    MDE = (t_{1-alpha/2, df} + t_{power, df}) * s * sqrt(1/n + 1/nb), the smallest true
    difference of means that a level-``alpha`` test detects with probability ``power`` when both
    arms have standard deviation ``s`` (``s``: the pooled seed-to-seed standard deviation, see
    ``pooled_sd``, or the SD of the paired differences times 1/sqrt(2) for a paired design).
    ``n`` seeds in the first arm, ``nb`` in the second (default ``n``: equal arms, and the
    factor is sqrt(2 / n)). ``df`` defaults to the pooled two-sample n + nb - 2. Fewer than 2
    seeds on a side (or df <= 0) -> inf: nothing can be detected without a spread.
    A comparison is "decided" for a stated effect e when its CI excludes 0 or MDE <= e.
    """
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"mde: need 0 < alpha < 1 and 0 < power < 1, got {alpha}, {power}")
    if s < 0 or math.isnan(s):
        raise ValueError(f"mde: s must be a standard deviation >= 0, got {s}")
    nb = n if nb is None else nb
    dof = n + nb - 2 if df is None else df
    if n < 2 or nb < 2 or dof <= 0:
        return math.inf
    t = float(_st().t.ppf(1 - alpha / 2, dof) + _st().t.ppf(power, dof))
    return t * s * math.sqrt(1.0 / n + 1.0 / nb)


def pooled_sd(sa: float, na: int, sb: float, nb: int) -> float:
    """The pooled standard deviation of two samples (sizes na, nb, sample SDs sa, sb), df
    na + nb - 2; nan when either side has fewer than 2 values."""
    if na < 2 or nb < 2:
        return NAN
    return math.sqrt(((na - 1) * sa * sa + (nb - 1) * sb * sb) / (na + nb - 2))


def welch(a: Iterable[float], b: Iterable[float], conf: float = 0.95) -> PairedResult:
    """Welch's two-sample comparison of mean(a) - mean(b) over the finite values (unpaired:
    different seeds, or arms whose seeds do not correspond). ``n`` is min(n_a, n_b); fewer
    than 2 values on a side -> nan interval and p-value. Welch-Satterthwaite df."""
    x, y = _finite(a), _finite(b)
    n = min(len(x), len(y))
    mean = float(x.mean() - y.mean()) if n else NAN
    if n < 2:
        return PairedResult(n, mean, NAN, NAN, NAN)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se2 = float(va + vb)
    if se2 == 0.0:  # both spreads zero: the limit of the test
        return PairedResult(n, mean, mean, mean, 1.0 if mean == 0.0 else 0.0)
    df = se2 ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))
    half = float(_st().t.ppf(0.5 + conf / 2, df) * math.sqrt(se2))
    p = float(_st().ttest_ind(x, y, equal_var=False).pvalue)
    return PairedResult(n, mean, mean - half, mean + half, p)
