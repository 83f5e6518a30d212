"""Verdicts with a rule: does this sweep agree with a paper's claim, or can it not tell?

A claim (orchestrator/spec/claims.py) compares two arms on one per-trial value. The rule:

1. Completed trials only (a diverged trial has no comparable final value); each arm needs at
   least 2 seeds.
2. Minimum detectable effect from the seed variance (two-sample t, pooled s, df = na + nb - 2):
   ``MDE = (t_{1-alpha/2, df} + t_{power, df}) * s_pooled * sqrt(1/na + 1/nb)``
   (``sqrt(2/n)`` for equal arms). An MDE at or above the paper's effect means the sweep could
   not see the effect even if it were there: "not testable here".
3. Controls the claim names (first loss vs ln(classes), s1/s2 gap, all-ones), and the training
   length (``min_steps``), must pass; each failure is one reason.
4. With no reason left: the difference arm - baseline with its pooled t-interval, signed so that
   positive is the paper's direction: "agrees" when the interval excludes 0 on the paper's side;
   "disagrees" when it excludes the paper's effect (the effect is ruled out, whatever the sign);
   otherwise "not testable here" (inconclusive, the interval holds both 0 and the effect).

Everything is a pure function of tables; ``write_verdicts`` writes verdicts.md / verdicts.csv.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as st

from orchestrator.analysis.load import ReportConfig, SweepData
from orchestrator.analysis.stats import mde, pooled_sd
from orchestrator.analysis.tables import _md_table, _small_gap_share, gap_source
from orchestrator.spec.claims import Claim
from orchestrator.spec.params import ident

__all__ = ["claim_verdict", "verdict_table", "load_claims", "write_verdicts", "AGREES",
           "DISAGREES", "UNTESTABLE"]

AGREES, DISAGREES, UNTESTABLE = "agrees", "disagrees", "not testable here"
NAN = float("nan")
_FIRST = ("cont0/probe_loss", "train/initial_loss")  # first-loss columns, preferred first


def _mde_pooled(sa: float, na: int, sb: float, nb: int, alpha: float = 0.05,
                power: float = 0.8) -> tuple[float, float, int]:
    """(MDE, s_pooled, df) of a two-sided two-sample t-test at ``alpha`` with ``power``, from
    the two arms' sample standard deviations and sizes (stats.pooled_sd, stats.mde)."""
    df = na + nb - 2
    if na < 2 or nb < 2:
        return NAN, NAN, df
    sp = pooled_sd(sa, na, sb, nb)
    return mde(sp, na, alpha, power, nb=nb), sp, df


def _matches(trials: pd.DataFrame, selector: dict[str, Any]) -> pd.Series:
    ok = pd.Series(True, index=trials.index)
    for key, want in selector.items():
        if key not in trials.columns:
            return pd.Series(False, index=trials.index)
        w = ident(want)

        def same(v: Any, w: tuple = w) -> bool:
            if isinstance(v, (np.floating, np.integer)):
                v = v.item()
            iv = ident(v)
            if iv[0] == "num" and w[0] == "num":
                return math.isclose(iv[1], w[1], rel_tol=1e-9, abs_tol=0.0)
            return iv == w

        ok &= trials[key].map(same)
    return ok


def _select(trials: pd.DataFrame, selector: dict[str, Any]) -> tuple[pd.DataFrame, list[str]]:
    """The trials of the one arm ``selector`` picks, and the arm labels it matched."""
    t = trials[_matches(trials, selector)]
    return t, list(dict.fromkeys(t["arm"]))


def _ones_columns(metric: str, columns: Iterable[str]) -> list[str]:
    """The all-ones control that belongs to ``metric``: taken at the same time (``cont0/`` at
    step 0, ``cont/`` at the end) and on the same vectors (``grad_ones_*`` for a gradient
    metric, ``ones_*`` for weights). A metric outside that scheme is checked against every
    end-of-training control, weights and gradients."""
    when, _, name = metric.partition("/")
    if when in ("cont", "cont0") and name:
        kind = "grad_ones_" if name.startswith("grad_") else "ones_"
        return [c for c in columns if c.startswith(f"{when}/{kind}")]
    return [c for c in columns if c.startswith(("cont/ones_", "cont/grad_ones_"))]


def _first_loss(t: pd.DataFrame) -> pd.Series:
    out = pd.Series(NAN, index=t.index)
    for col in reversed(_FIRST):  # the preferred column last, so it wins where present
        if col in t.columns:
            v = pd.to_numeric(t[col], errors="coerce")
            out = v.where(v.notna(), out)
    return out


def claim_verdict(claim: Claim, trials: pd.DataFrame, metrics: pd.DataFrame | None = None,
                  min_gap: float = 1.05) -> dict[str, Any]:
    """One row: the numbers behind the verdict on ``claim`` and the verdict with its reasons.

    ``trials``: one row per trial (``arm``, ``seed``, ``status``, params, ``last_step``, the
    claim's metric and the control columns); ``metrics``: the per-matrix rows (for s1/s2)."""
    row: dict[str, Any] = {"claim": claim.id, "paper": claim.paper, "metric": claim.metric,
                           "direction": claim.direction, "effect": claim.effect,
                           "effect_source": claim.effect_source}
    reasons: list[str] = []
    ta, arms_a = _select(trials, claim.arm)
    tb, arms_b = _select(trials, claim.baseline)
    row["arm"], row["baseline"] = "; ".join(arms_a) or "-", "; ".join(arms_b) or "-"
    for side, arms in (("arm", arms_a), ("baseline", arms_b)):
        if len(arms) != 1:
            reasons.append(f"{side} selector matches {len(arms)} arms (needs exactly 1)")
    if claim.metric not in trials.columns:
        reasons.append(f"metric {claim.metric} not recorded")
    if reasons:
        return {**row, "verdict": UNTESTABLE, "reasons": "; ".join(reasons)}
    row["diverged_arm"] = int((ta["status"] == "diverged").sum())
    row["diverged_baseline"] = int((tb["status"] == "diverged").sum())
    ta, tb = ta[ta["status"] == "completed"], tb[tb["status"] == "completed"]
    a = pd.to_numeric(ta[claim.metric], errors="coerce").dropna().to_numpy(float)
    b = pd.to_numeric(tb[claim.metric], errors="coerce").dropna().to_numpy(float)
    na, nb = len(a), len(b)
    row.update(n_arm=na, n_baseline=nb, mean_arm=a.mean() if na else NAN,
               mean_baseline=b.mean() if nb else NAN)
    sa = float(a.std(ddof=1)) if na > 1 else NAN
    sb = float(b.std(ddof=1)) if nb > 1 else NAN
    mde, sp, df = _mde_pooled(sa, na, sb, nb, claim.alpha, claim.power)
    row.update(s_pooled=sp, df=df, mde=mde)
    if na < 2 or nb < 2:
        reasons.append(f"too few completed seeds ({na} arm, {nb} baseline, need 2 each)")
    elif not mde < claim.effect:
        reasons.append(f"MDE {mde:.4g} >= {claim.effect_source} effect {claim.effect:.4g}")
    diff = row["mean_arm"] - row["mean_baseline"]
    half = NAN
    if na >= 2 and nb >= 2:
        half = float(st.t.ppf(1 - claim.alpha / 2, df)) * sp * math.sqrt(1 / na + 1 / nb)
    row.update(diff=diff, lo=diff - half, hi=diff + half)
    row["p_value"] = (float(st.ttest_ind(a, b).pvalue) if na >= 2 and nb >= 2 and sp > 0
                      else NAN)
    both = pd.concat([ta, tb])
    reasons += _control_reasons(claim, both, metrics, min_gap, row)
    if reasons:
        return {**row, "verdict": UNTESTABLE, "reasons": "; ".join(reasons)}
    sign = 1.0 if claim.direction == "higher" else -1.0
    lo_s, hi_s = sorted((sign * row["lo"], sign * row["hi"]))
    if lo_s > 0:
        note = "" if hi_s >= claim.effect else "smaller than the paper's effect"
        return {**row, "verdict": AGREES, "reasons": note}
    if hi_s < claim.effect:
        return {**row, "verdict": DISAGREES,
                "reasons": f"the interval excludes the {claim.effect_source} effect"}
    return {**row, "verdict": UNTESTABLE,
            "reasons": "inconclusive: the interval holds both 0 and the effect"}


def _control_reasons(claim: Claim, t: pd.DataFrame, metrics: pd.DataFrame | None,
                     min_gap: float, row: dict[str, Any]) -> list[str]:
    """Reasons from the training length and the claim's controls; fills ``row``'s numbers."""
    reasons: list[str] = []
    steps = pd.to_numeric(t["last_step"], errors="coerce") if "last_step" in t.columns \
        else pd.Series(dtype=float)
    row["steps_run"] = float(steps.min()) if steps.notna().any() else NAN
    row["min_steps"] = claim.min_steps
    if math.isnan(row["steps_run"]):
        reasons.append("training length not recorded (no last_step)")
    elif row["steps_run"] < claim.min_steps:
        reasons.append(f"too few steps: ran {row['steps_run']:.0f}, claim needs "
                       f"{claim.min_steps}")
    if "first_loss" in claim.controls:
        target = math.log(claim.n_classes or 2)
        first = _first_loss(t).dropna()
        row["first_loss_target"] = target
        row["first_loss_worst"] = (float(first.iloc[int(np.argmax(np.abs(first / target - 1)))])
                                   if len(first) else NAN)
        if first.empty:
            reasons.append("first loss not recorded")
        elif float(np.max(np.abs(first / target - 1))) > claim.first_loss_tol:
            reasons.append(f"first loss {row['first_loss_worst']:.4g} far from ln("
                           f"{claim.n_classes}) = {target:.4g}")
    if "ones" in claim.controls:
        cols = _ones_columns(claim.metric, t.columns)
        vals = t[cols].apply(pd.to_numeric, errors="coerce") if cols else pd.DataFrame()
        per_arm = vals.groupby(t["arm"]).mean() if cols else pd.DataFrame()
        arr = per_arm.to_numpy()
        worst = float(np.nanmax(arr)) if arr.size and np.isfinite(arr).any() else NAN
        row["ones_worst"] = worst
        if not math.isfinite(worst):
            reasons.append("all-ones control not recorded")
        elif worst > claim.ones_max:
            i, j = np.unravel_index(int(np.nanargmax(arr)), arr.shape)
            reasons.append(f"all-ones control high ({worst:.3g} > {claim.ones_max}: "
                           f"{per_arm.columns[j]} in {per_arm.index[i]})")
    if "small_gap" in claim.controls:
        gap = _small_gap_share(metrics if metrics is not None else pd.DataFrame(),
                               t["trial"], min_gap, *gap_source(claim.metric))
        share = float(np.mean(list(gap.values()))) if gap else NAN
        row["small_gap"] = share
        if not math.isfinite(share):
            reasons.append("s1/s2 not recorded")
        elif share >= 0.5:
            reasons.append(f"top-1 degenerate: {share:.0%} of matrices have s1/s2 < {min_gap}")
    return reasons


def verdict_table(claims: list[Claim], trials: pd.DataFrame,
                  metrics: pd.DataFrame | None = None, min_gap: float = 1.05) -> pd.DataFrame:
    """One row per claim (``claim_verdict``), in the spec's order."""
    return pd.DataFrame([claim_verdict(c, trials, metrics, min_gap) for c in claims])


def load_claims(root: str | Path) -> list[Claim]:
    """The claims of the spec the sweep ran (``<root>/spec.yaml``); none without one."""
    import yaml

    f = Path(root) / "spec.yaml"
    if not f.exists():
        return []
    raw = yaml.safe_load(f.read_text()) or {}
    return [Claim(**c) for c in raw.get("claims") or []]


_MD_COLS = ["claim", "verdict", "reasons", "metric", "n_arm", "n_baseline", "diff", "lo", "hi",
            "mde", "effect", "steps_run", "first_loss_worst", "ones_worst", "small_gap"]


def write_verdicts(data: SweepData, out: Path, cfg: ReportConfig | None = None) -> list[str]:
    """Write ``out/verdicts.{csv,md}`` for the spec's claims; the report.md lines (none when
    the spec declares no claims)."""
    cfg = cfg or ReportConfig()
    claims = load_claims(data.root)
    if not claims:
        return []
    table = verdict_table(claims, data.trials, data.metrics, cfg.min_gap)
    table.to_csv(out / "verdicts.csv", index=False)
    cols = [c for c in _MD_COLS if c in table.columns]
    lines = ["## Verdicts", "",
             "Rule (orchestrator/analysis/verdicts.py): agrees / disagrees only when the "
             "minimum detectable effect (alpha 0.05, power 0.8, from seed variance) is below the "
             "paper's effect and every control passes; otherwise not testable here, with the "
             "reason. diff = arm - baseline [95% pooled t-interval].", "",
             _md_table(table[cols]), "",
             "Claims: " + "; ".join(f"**{c.id}** ({c.paper}): {c.text}" for c in claims), ""]
    (out / "verdicts.md").write_text("\n".join(["# Verdicts: " + data.name, ""] + lines[2:]))
    return lines + ["Numbers: [verdicts.csv](verdicts.csv).", ""]
