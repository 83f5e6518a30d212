"""Which arm a report compares against (issue 17 §4): never a diverged one.

The report once picked a diverged trial's arm as baseline, so every difference and p-value
was "-". The order here:

1. ``--baseline ARM`` on the command line (must be an arm);
2. the spec's named baseline, ``report: {baseline: ...}``: an arm label, or a mapping of
   space keys to values (``{model.residual.family: pre_ln}``) that exactly one arm matches;
3. the conventional reference of an ablation, an arm naming ``pre_ln`` or ``unconstrained``,
   if it has a completed trial (a named baseline in effect);
4. the best completed arm: lowest mean ``metric`` over its completed trials;
5. no arm completed anything: the first arm (there is nothing to compare anyway).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.analysis.load import ReportError, arm_order
from orchestrator.spec.params import fmt, scalar

__all__ = ["choose_baseline", "match_named"]


def _pairs(arm: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in arm.split(",") if "=" in p)


def match_named(arms: list[str], named: str | Mapping[str, Any]) -> str:
    """The arm the spec's ``report.baseline`` names (one line naming the field otherwise)."""
    if isinstance(named, str):
        if named not in arms:
            raise ReportError(f"report.baseline: unknown arm {named!r}; arms are: "
                              + "; ".join(arms))
        return named
    want = {k: fmt(scalar(v, f"report.baseline.{k}")) for k, v in named.items()}
    hits = [a for a in arms if all(_pairs(a).get(k) == v for k, v in want.items())]
    if len(hits) != 1:
        raise ReportError(f"report.baseline: {dict(named)} matches {len(hits)} arms, needs "
                          "exactly 1; arms are: " + "; ".join(arms))
    return hits[0]


def choose_baseline(trials: pd.DataFrame, metric: str, baseline: str | None = None,
                    named: str | Mapping[str, Any] | None = None) -> str:
    """The baseline arm of ``trials`` (rules in the module docstring)."""
    arms = arm_order(trials)
    if baseline is not None:
        if baseline not in arms:
            raise ReportError(f"--baseline: unknown arm {baseline!r}; arms are: "
                              + "; ".join(arms))
        return baseline
    if named is not None:
        return match_named(arms, named)
    done = trials[trials["status"] == "completed"]
    means = pd.to_numeric(done[metric], errors="coerce").groupby(done["arm"]).mean()
    means = means[means.map(math.isfinite)]
    for arm in arms:
        if ("pre_ln" in arm or "unconstrained" in arm) and arm in means.index:
            return arm
    if len(means):
        best = means.min()
        return next(a for a in arms if a in means.index and means[a] == best)
    return arms[0]
