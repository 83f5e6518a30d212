"""The decision rule of a claim's verdict: pure functions of numbers (issue 30).

Two answers per claim, judged apart, on the difference arm - baseline signed so that positive is
the paper's direction ("lo_s, hi_s"):

- **direction**: ``confirmed`` (the test rejects 0 at the Holm-adjusted level and the estimate
  is on the paper's side), ``opposite`` (rejected, other side), ``undecided``; or
  ``deterministic`` when every seed gives the same difference (zero spread: there is no
  interval, and the sign is exact for this setup, not an estimate).
- **size** against the claim's effect e: ``no effect of the claimed size`` (equivalence: the
  interval inside +-the smallest effect of interest), ``smaller`` (the interval below e),
  ``larger`` (above e), ``consistent`` (it holds e and excludes 0), else ``undecided``.

The MDE never decides: it only explains an undecided direction (``underpowered`` with the seeds
per arm that would detect e). A design is ``paired`` by seed when both arms' seeds are the same
set (same data order and init per seed), ``welch`` otherwise; a divergence rate is compared by
Fisher's exact test, with Wilson intervals per arm and Newcombe's interval of the difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.stats import wilson_interval

__all__ = ["Comparison", "compare", "from_summary", "compare_rates", "direction_answer",
           "size_answer", "seeds_needed", "DIRECTIONS", "SIZES"]

NAN = float("nan")
DIRECTIONS = ("confirmed", "opposite", "undecided", "deterministic")
SIZES = ("consistent", "smaller", "larger", "no effect of the claimed size", "undecided")
_MAX_SEEDS = 10_000


def _st():
    from scipy import stats

    return stats


@dataclass(frozen=True)
class Comparison:
    """arm - baseline: the estimate, its interval and test, and what the MDE needs."""

    design: str  # paired | welch | deterministic | rates | none
    n_arm: int
    n_baseline: int
    diff: float
    lo: float
    hi: float
    p: float
    se: float  # standard error of diff (nan for rates / deterministic)
    df: float
    sd_arm: float = NAN
    sd_baseline: float = NAN
    sd_diff: float = NAN  # paired: SD of the per-seed differences

    def mde(self, alpha: float, power: float) -> float:
        """(t_{1-alpha/2, df} + t_{power, df}) x se: the smallest true difference the test
        detects with probability ``power`` (exact noncentral-t power within ~1%)."""
        if self.design not in ("paired", "welch") or not self.df > 0:
            return NAN
        t = _st().t
        return float((t.ppf(1 - alpha / 2, self.df) + t.ppf(power, self.df)) * self.se)


def _zero(sd: float, x: np.ndarray) -> bool:
    """A spread that is rounding only (1e-12 of the values' scale): every seed the same."""
    return sd <= 1e-12 * max(1.0, float(np.abs(x).max()))


def compare(a: Mapping, b: Mapping, alpha: float = 0.05) -> Comparison:
    """``a``/``b``: seed -> finite value. Paired on the seeds when both arms have the same
    seed set (at least 2), Welch otherwise; zero spread gives ``deterministic``."""
    sa, sb = sorted(a), sorted(b)
    x = np.array([a[k] for k in sa], float)
    y = np.array([b[k] for k in sb], float)
    na, nb = len(x), len(y)
    mean_a, mean_b = (float(x.mean()) if na else NAN), (float(y.mean()) if nb else NAN)
    diff = mean_a - mean_b
    sd_a = float(x.std(ddof=1)) if na > 1 else NAN
    sd_b = float(y.std(ddof=1)) if nb > 1 else NAN
    if na < 2 or nb < 2:
        return Comparison("none", na, nb, diff, NAN, NAN, NAN, NAN, NAN, sd_a, sd_b)
    t = _st().t
    if sa == sb:
        d = x - y
        sd_d = float(d.std(ddof=1))
        if _zero(sd_d, d):
            return Comparison("deterministic", na, nb, diff, NAN, NAN, NAN, 0.0, na - 1,
                              sd_a, sd_b, 0.0)
        se, df = sd_d / math.sqrt(na), na - 1
        tt = diff / se
        p = float(2 * t.sf(abs(tt), df))
        half = float(t.ppf(1 - alpha / 2, df) * se)
        return Comparison("paired", na, nb, diff, diff - half, diff + half, p, se, df,
                          sd_a, sd_b, sd_d)
    va, vb = sd_a**2 / na, sd_b**2 / nb
    se2 = va + vb
    if _zero(sd_a, x) and _zero(sd_b, y):
        return Comparison("deterministic", na, nb, diff, NAN, NAN, NAN, 0.0, NAN, sd_a, sd_b)
    se = math.sqrt(se2)
    df = se2**2 / ((va**2 / (na - 1) if va else 0.0) + (vb**2 / (nb - 1) if vb else 0.0))
    p = float(2 * t.sf(abs(diff / se), df))
    half = float(t.ppf(1 - alpha / 2, df) * se)
    return Comparison("welch", na, nb, diff, diff - half, diff + half, p, se, df, sd_a, sd_b)


def from_summary(n_arm: int, n_baseline: int, diff: float, sd_arm: float, sd_baseline: float,
                 *, sd_diff: float | None = None, alpha: float = 0.05) -> Comparison:
    """The comparison from published summaries instead of per-seed values (re-judging a table
    whose seeds are gone): paired when ``sd_diff`` (the SD of the per-seed differences, equal
    n) is given, else Welch from the two arms' SDs; zero spread is deterministic."""
    t = _st().t
    if n_arm < 2 or n_baseline < 2:
        return Comparison("none", n_arm, n_baseline, diff, NAN, NAN, NAN, NAN, NAN,
                          sd_arm, sd_baseline)
    if sd_diff is not None:
        if sd_diff == 0.0:
            return Comparison("deterministic", n_arm, n_baseline, diff, NAN, NAN, NAN, 0.0,
                              n_arm - 1, sd_arm, sd_baseline, 0.0)
        se, df = sd_diff / math.sqrt(n_arm), n_arm - 1
        design = "paired"
    else:
        va, vb = sd_arm**2 / n_arm, sd_baseline**2 / n_baseline
        if va + vb == 0.0:
            return Comparison("deterministic", n_arm, n_baseline, diff, NAN, NAN, NAN, 0.0,
                              NAN, sd_arm, sd_baseline)
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / ((va**2 / (n_arm - 1) if va else 0.0)
                               + (vb**2 / (n_baseline - 1) if vb else 0.0))
        design = "welch"
    p = float(2 * t.sf(abs(diff / se), df))
    half = float(t.ppf(1 - alpha / 2, df) * se)
    return Comparison(design, n_arm, n_baseline, diff, diff - half, diff + half, p, se, df,
                      sd_arm, sd_baseline, NAN if sd_diff is None else sd_diff)


def compare_rates(k_a: int, n_a: int, k_b: int, n_b: int, alpha: float = 0.05) -> Comparison:
    """Rate k_a/n_a - k_b/n_b: Newcombe's hybrid-score interval (from the two Wilson
    intervals) and Fisher's exact two-sided p."""
    if n_a < 1 or n_b < 1:
        return Comparison("rates", n_a, n_b, NAN, NAN, NAN, NAN, NAN, NAN)
    conf = 1 - alpha
    pa, la, ua = wilson_interval(k_a, n_a, conf)
    pb, lb, ub = wilson_interval(k_b, n_b, conf)
    diff = pa - pb
    lo = diff - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    hi = diff + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    p = float(_st().fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue)
    return Comparison("rates", n_a, n_b, diff, lo, hi, p, NAN, NAN)


def _signed(c: Comparison, sign: float) -> tuple[float, float, float]:
    d = sign * c.diff
    lo, hi = sorted((sign * c.lo, sign * c.hi))
    return d, lo, hi


def direction_answer(c: Comparison, sign: float, p_adjusted: float, alpha: float) -> str:
    """``sign``: +1 when the paper says higher, -1 lower. ``p_adjusted``: Holm over the spec's
    claims (the claim's own p when judged alone)."""
    if c.design == "deterministic":
        return "deterministic"
    d, _, _ = _signed(c, sign)
    if not math.isfinite(p_adjusted) or not math.isfinite(d) or p_adjusted >= alpha:
        return "undecided"
    return "confirmed" if d > 0 else "opposite"


def size_answer(c: Comparison, sign: float, effect: float, margin: float | None) -> str:
    """The estimate's size against ``effect`` (see the module docstring); ``margin``: the
    smallest effect of interest (None: no equivalence test)."""
    if c.design in ("deterministic", "none"):
        return "-"
    _, lo, hi = _signed(c, sign)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided"
    if margin is not None and -margin < lo and hi < margin:
        return "no effect of the claimed size"
    if hi < effect:
        return "smaller"
    if lo > effect:
        return "larger"
    return "consistent" if lo > 0 else "undecided"


def seeds_needed(c: Comparison, target: float, alpha: float, power: float) -> int | None:
    """Seeds per arm (pairs for a paired design) at which the MDE, at the spreads seen, falls
    to ``target``; None when the spreads are unknown, more than 10,000 seeds."""
    t = _st().t
    if c.design == "paired":
        s2, df_of = c.sd_diff**2, (lambda n: n - 1)
    elif c.design == "welch":
        va, vb = c.sd_arm**2, c.sd_baseline**2
        s2 = va + vb

        def df_of(n: int) -> float:
            den = (va**2 + vb**2) / (n - 1)
            return (va + vb) ** 2 / den if den > 0 else n - 1
    else:
        return None
    if not (math.isfinite(s2) and s2 > 0 and target > 0):
        return None
    for n in range(2, _MAX_SEEDS + 1):
        df = df_of(n)
        if (t.ppf(1 - alpha / 2, df) + t.ppf(power, df)) * math.sqrt(s2 / n) <= target:
            return n
    return None
