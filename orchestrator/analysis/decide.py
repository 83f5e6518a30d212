"""Seeds until decided (issue 17 §5): which arms still need seeds, racing-style.

After each round, every non-baseline arm is compared with the baseline on the report metric
(final val loss by default), paired by seed over the seeds both completed, the p-values
Holm-adjusted over all compared arms (conservative: a decided arm still counts). An arm is

- ``better`` / ``worse``: the Holm-adjusted paired p-value < alpha (its CI excludes 0);
- ``equivalent``: not significant, but the minimum detectable effect of the paired design
  is at or below the stated ``effect``: a difference worth having would have been seen;
- ``budget``: still undecided with ``max`` seeds: the budget is spent;
- ``undecided``: none of these: it gets ``per_round`` more seeds (and so does the baseline,
  to keep the comparison paired).

This is F-Race's idea (Birattari et al. 2002; irace) with t-tests: configurations leave the
race as soon as the data decide them, and seeds go only where they still change the answer.
MDE of the paired design: ``stats.mde(s_d / sqrt 2, n, df = n - 1)`` = (t_{1-a/2} + t_{power})
s_d / sqrt(n) with s_d the SD of the per-seed differences (the two-sample formula with the
paired differences' spread; docs/science.md has the statistics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from orchestrator.analysis.stats import holm, mde, paired_difference

__all__ = ["Decision", "decide", "seeds_to_add"]


@dataclass(frozen=True)
class Decision:
    arm: str
    n: int  # paired seeds (both arms completed)
    seeds: int  # seeds the arm has run (any status)
    diff: float  # mean(arm - baseline)
    lo: float
    hi: float
    p_holm: float
    mde: float
    state: str  # better | worse | equivalent | budget | undecided


def decide(trials: pd.DataFrame, baseline: str, metric: str = "final_val_loss", *,
           effect: float, max_seeds: int, alpha: float = 0.05,
           power: float = 0.8) -> list[Decision]:
    """One ``Decision`` per non-baseline arm of ``trials`` (``arm, seed, status, metric``)."""
    def by_seed(arm: str) -> pd.Series:
        g = trials[(trials["arm"] == arm) & (trials["status"] == "completed")]
        return pd.to_numeric(g[metric], errors="coerce").groupby(g["seed"]).mean()

    base = by_seed(baseline)
    arms = [a for a in dict.fromkeys(trials["arm"]) if a != baseline]
    prs = [paired_difference(by_seed(a), base, 1 - alpha) for a in arms]
    adj = holm([pr.p for pr in prs])
    out = []
    for arm, pr, q in zip(arms, prs, adj):
        seeds = int(trials.loc[trials["arm"] == arm, "seed"].nunique())
        d = (by_seed(arm) - base).dropna()
        s_d = float(d.std(ddof=1)) if len(d) >= 2 else math.nan
        m = math.inf if math.isnan(s_d) else mde(s_d / math.sqrt(2), pr.n, alpha, power,
                                                   df=pr.n - 1)
        if not math.isnan(q) and q < alpha:
            state = "better" if pr.mean < 0 else "worse"
        elif m <= effect:
            state = "equivalent"
        elif seeds >= max_seeds:
            state = "budget"
        else:
            state = "undecided"
        out.append(Decision(arm, pr.n, seeds, pr.mean, pr.lo, pr.hi, q, m, state))
    return out


def seeds_to_add(decisions: list[Decision], baseline: str, per_round: int,
                 max_seeds: int) -> dict[str, int]:
    """arm -> seeds to add this round: ``per_round`` (capped by the budget) for every
    undecided arm, and as many for the baseline (paired comparisons); {} when decided."""
    add = {d.arm: int(np.clip(max_seeds - d.seeds, 0, per_round))
           for d in decisions if d.state == "undecided"}
    add = {a: k for a, k in add.items() if k > 0}
    if add:
        add[baseline] = max(add.values())
    return add
