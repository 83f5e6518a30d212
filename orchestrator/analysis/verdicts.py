"""Verdicts that say what the data say: a spec's claims judged on a sweep's tables (issue 30).

A claim (orchestrator/spec/claims.py) compares two arms on one per-trial value (or two values
of the same trials). Every claim gets two answers, judged apart (orchestrator/analysis/
decision.py): the **direction** (confirmed / opposite / undecided, or deterministic for zero
spread) and the **size** against the claim's effect (consistent / smaller / larger / no effect
of the claimed size by equivalence / undecided). The rule:

1. The comparison: completed trials, paired by seed where both arms ran the same seeds, Welch
   otherwise; a ``diverged`` claim compares the rates (Fisher exact, Wilson per arm). Holm
   over the spec's claims adjusts the p-values the direction is decided on (``verdict_table``).
2. Preconditions, for every claim; any failure withholds both answers ("not testable here",
   the numbers still shown): exactly one arm per side, the metric recorded, >= 2 completed
   seeds per arm, ``min_steps``, no verdict resting on survivors (an arm that lost more than
   ``max_diverged_share`` of its seeds), "did it train" (orchestrator/analysis/
   claim_controls.py) and ``outgrew_init`` when listed.
3. Metric controls (first loss, all-ones, s1/s2 gap, step saturation), each arm on its own: a
   failing arm is named. For a ``source: paper`` claim they are shown beside the answers
   (``flags``); for a ``source: proxy`` claim they withhold them.
4. The MDE is reported and only explains an undecided direction ("underpowered: about N
   seeds per arm would detect the effect"). Divergence rates per arm and their Fisher
   comparison are part of every row.

Everything is a pure function of tables; ``write_verdicts`` writes verdicts.md / verdicts.csv.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.analysis.claim_controls import metric_controls, trained
from orchestrator.analysis.decision import (
    Comparison,
    compare,
    compare_rates,
    direction_answer,
    seeds_needed,
    size_answer,
)
from orchestrator.analysis.load import ReportConfig, SweepData
from orchestrator.analysis.stats import holm, wilson_interval
from orchestrator.analysis.tables import _md_table
from orchestrator.spec.claims import DIVERGED, Claim, parse_rows_metric
from orchestrator.spec.params import ident

__all__ = ["claim_verdict", "verdict_table", "judge", "load_claims", "write_verdicts",
           "UNTESTABLE"]

UNTESTABLE = "not testable here"
NAN = float("nan")
_TERMINAL = ("completed", "diverged")


# --- selecting arms and values --------------------------------------------------------------


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


def _values(metric: str, t: pd.DataFrame, metrics: pd.DataFrame | None) -> pd.Series | None:
    """Per-trial values of ``metric`` (index as ``t``); None when it is not recorded."""
    if metric == DIVERGED:
        return t["status"].map({"diverged": 1.0, "completed": 0.0}).astype(float)
    rows = parse_rows_metric(metric)
    if rows is None:
        return pd.to_numeric(t[metric], errors="coerce") if metric in t.columns else None
    name, modules = rows
    m = metrics if metrics is not None else pd.DataFrame()
    if m.empty or "metric" not in m.columns:
        return None
    r = m[(m["metric"] == name) & m["module"].isin(modules) & m["trial"].isin(t["trial"])]
    if r.empty:
        return None
    r = r[r["step"] == r.groupby("trial")["step"].transform("max")]
    per = r.groupby("trial")["value"].mean()
    return t["trial"].map(per).astype(float)


def _by_seed(t: pd.DataFrame, v: pd.Series) -> dict:
    keys = t["seed"] if "seed" in t.columns else t["trial"]
    ok = v.notna() & np.isfinite(v)
    return dict(zip(keys[ok], v[ok].astype(float)))


# --- the verdict ------------------------------------------------------------------------------


def claim_verdict(claim: Claim, trials: pd.DataFrame, metrics: pd.DataFrame | None = None,
                  min_gap: float = 1.05, *, reference_loss: float | None = None,
                  p_adjusted: float | None = None) -> dict[str, Any]:
    """One row: the numbers behind the two answers on ``claim``, the answers and their reasons.

    ``trials``: one row per trial (``trial``, ``arm``, ``seed``, ``status``, params,
    ``last_step``, the claim's metric and the control columns); ``metrics``: the per-matrix
    rows (s1/s2, ``ROW[modules]`` metrics). ``reference_loss``: the data's frequency baseline
    for "did it train" (default ln(n_classes)). ``p_adjusted``: the Holm-adjusted p of this
    claim in its spec (``verdict_table``); alone, its own p."""
    row: dict[str, Any] = {"claim": claim.id, "source": claim.source, "paper": claim.paper,
                           "why_proxy": claim.reason or "", "metric": claim.metric,
                           "versus": claim.versus or "", "direction_claimed": claim.direction,
                           "effect": claim.effect, "effect_source": claim.effect_source}
    blockers: list[str] = []
    if claim.versus is not None:
        ta, arms_a = _select(trials, claim.arm)
        tb, arms_b = ta, arms_a
        sides = (("arm", arms_a),)
    else:
        ta, arms_a = _select(trials, claim.arm)
        tb, arms_b = _select(trials, claim.baseline)
        sides = (("arm", arms_a), ("baseline", arms_b))
    row["arm"], row["baseline"] = "; ".join(arms_a) or "-", "; ".join(arms_b) or "-"
    for side, arms in sides:
        if len(arms) != 1:
            blockers.append(f"{side} selector matches {len(arms)} arms (needs exactly 1)")
    va = _values(claim.metric, ta, metrics) if not blockers else None
    vb = _values(claim.versus or claim.metric, tb, metrics) if not blockers else None
    if not blockers:
        for name, v in ((claim.metric, va), (claim.versus, vb)):
            if name is not None and v is None:
                blockers.append(f"metric {name} not recorded")
    if blockers:
        return _finish(row, claim, None, blockers, [], [])
    label_a, label_b = arms_a[0], arms_b[0]
    blockers += _divergence(row, claim, ta, tb, label_a, label_b)
    rates = claim.metric == DIVERGED
    keep = ta["status"].isin(_TERMINAL) if rates else ta["status"] == "completed"
    keep_b = tb["status"].isin(_TERMINAL) if rates else tb["status"] == "completed"
    ca, cb = ta[keep], tb[keep_b]
    a, b = _by_seed(ca, va[keep]), _by_seed(cb, vb[keep_b])
    if claim.versus is not None:  # the same trials: pair on the seeds with both values
        both = a.keys() & b.keys()
        a, b = {k: a[k] for k in both}, {k: b[k] for k in both}
    if rates:
        comp = compare_rates(int(sum(a.values())), len(a), int(sum(b.values())), len(b),
                             claim.alpha)
    else:
        comp = compare(a, b, claim.alpha)
    _numbers(row, claim, comp)
    if not rates and (len(a) < 2 or len(b) < 2):
        blockers.append(f"too few completed seeds ({len(a)} arm, {len(b)} baseline, "
                        "need 2 each)")
    arms = {label_a: ca} if claim.versus is not None else {label_a: ca, label_b: cb}
    blockers += _length(row, claim, pd.concat([ca, cb]) if claim.versus is None else ca)
    if not rates and not claim.metric.startswith("cont0/"):  # step 0 needs no training
        t_row, fails = trained(claim, arms, reference_loss)
        row.update(t_row)
        # an unknown baseline withholds a loss claim only; a collapsed arm withholds any
        if math.isfinite(t_row["trained_reference"]) or "loss" in claim.metric:
            blockers += [msg for _, msg in fails]
    c_row, c_fails = metric_controls(claim, arms, metrics, min_gap)
    row.update(c_row)
    blockers += [msg for name, msg in c_fails if name == "outgrew_init"]
    flags = [msg for name, msg in c_fails if name != "outgrew_init"]
    done_a, done_b = ta[ta["status"] == "completed"], tb[tb["status"] == "completed"]
    signals = [_signal(s, done_a, done_b, metrics, claim) for s in claim.signals]
    p = comp.p if p_adjusted is None else p_adjusted
    row["p_holm"] = p
    return _finish(row, claim, comp, blockers, flags, signals)


def _divergence(row: dict, claim: Claim, ta: pd.DataFrame, tb: pd.DataFrame, label_a: str,
                label_b: str) -> list[str]:
    """Each arm's divergence rate (Wilson) and their Fisher comparison; the survivors rule."""
    out = []
    versus = claim.versus
    sides = (("arm", ta, label_a),) if versus is not None else \
        (("arm", ta, label_a), ("baseline", tb, label_b))
    counts = {}
    for side, t, label in sides:
        n = int(t["status"].isin(_TERMINAL).sum())
        k = int((t["status"] == "diverged").sum())
        counts[side] = (k, n)
        rate, lo, hi = wilson_interval(k, n, 1 - claim.alpha) if n else (NAN, 0.0, 1.0)
        row[f"diverged_{side}"] = f"{k}/{n} [{lo:.2f}, {hi:.2f}]"
        if n and k / n > claim.max_diverged_share and claim.metric != DIVERGED:
            out.append(f"{label} lost {k}/{n} seeds to divergence ({rate:.0%} > "
                       f"the {claim.max_diverged_share:.0%} a verdict may rest on): no verdict "
                       "on its survivors")
    if versus is None:
        (ka, na), (kb, nb) = counts["arm"], counts["baseline"]
        row["diverged_fisher_p"] = compare_rates(ka, na, kb, nb).p if na and nb else NAN
    return out


def _length(row: dict, claim: Claim, t: pd.DataFrame) -> list[str]:
    steps = pd.to_numeric(t["last_step"], errors="coerce") if "last_step" in t.columns \
        else pd.Series(dtype=float)
    row["steps_run"] = float(steps.min()) if steps.notna().any() else NAN
    row["min_steps"] = claim.min_steps
    if t.empty:
        return []
    if math.isnan(row["steps_run"]):
        return ["training length not recorded (no last_step)"]
    if row["steps_run"] < claim.min_steps:
        return [f"too few steps: ran {row['steps_run']:.0f}, claim needs {claim.min_steps}"]
    return []


def _numbers(row: dict, claim: Claim, c: Comparison) -> None:
    row.update(design=c.design, n_arm=c.n_arm, n_baseline=c.n_baseline, diff=c.diff,
               lo=c.lo, hi=c.hi, p_value=c.p, sd_arm=c.sd_arm, sd_baseline=c.sd_baseline,
               sd_diff=c.sd_diff, df=c.df, mde=c.mde(claim.alpha, claim.power))


def _margin(claim: Claim) -> float | None:
    if claim.smallest_effect is not None:
        return claim.smallest_effect
    return claim.effect if claim.effect_source == "design" else None


def _finish(row: dict, claim: Claim, comp: Comparison | None, blockers: list[str],
            flags: list[str], signals: list[str]) -> dict[str, Any]:
    row["flags"] = "; ".join(flags)
    row["signals"] = "; ".join(signals)
    withheld = blockers + (flags if claim.source == "proxy" else [])
    if comp is None or withheld:
        row.update(direction="untestable", size="-", verdict=UNTESTABLE,
                   reasons="; ".join(withheld))
        row.setdefault("seeds_needed", NAN)
        return row
    sign = 1.0 if claim.direction == "higher" else -1.0
    direction = direction_answer(comp, sign, row.get("p_holm", comp.p), claim.alpha)
    size = size_answer(comp, sign, claim.effect, _margin(claim))
    whose = "the paper's" if claim.effect_source == "paper" else "our"
    reasons = []
    need = seeds_needed(comp, claim.effect, claim.alpha, claim.power)
    row["seeds_needed"] = float(need) if need is not None else NAN
    mde = row.get("mde", NAN)
    if direction == "deterministic":
        reasons.append(f"zero spread: arm - baseline = {comp.diff:+.4g} in every seed; no "
                       "interval (exact for this setup, not a sampling result)")
    elif direction == "undecided":
        if math.isfinite(mde) and mde > claim.effect:
            more = f"about {need} seeds per arm would detect it" if need else \
                "more seeds than 10,000 per arm would be needed"
            reasons.append(f"underpowered: MDE {mde:.3g} > {whose} effect {claim.effect:.3g}; "
                           + more)
        elif math.isfinite(mde):
            reasons.append(f"powered (MDE {mde:.3g} <= {whose} effect {claim.effect:.3g}): "
                           "an effect of that size would have been seen")
        elif comp.design == "rates":
            reasons.append(f"divergence-rate difference {comp.diff:+.2f} [{comp.lo:+.2f}, "
                           f"{comp.hi:+.2f}], Fisher p = {comp.p:.3g}")
    if math.isfinite(row.get("p_holm", NAN)) and row["p_holm"] != comp.p:
        reasons.append(f"Holm-adjusted p {row['p_holm']:.3g} over the spec's claims")
    if size != "-":
        reasons.append(f"size vs {whose} effect {claim.effect:.3g}"
                       + (f" (equivalence margin {_margin(claim):.3g})" if _margin(claim)
                          else ""))
    verdict = f"direction {direction}" + (f", size {size}" if size != "-" else "")
    row.update(direction=direction, size=size, verdict=verdict + (" (flagged)" if flags else ""),
               reasons="; ".join(reasons))
    return row


def judge(claim: Claim, comp: Comparison, *, blockers: list[str] = (), flags: list[str] = (),
          signals: list[str] = (), p_adjusted: float | None = None) -> dict[str, Any]:
    """The two answers from a comparison made elsewhere (``decision.from_summary`` on a
    published table whose seeds are gone: docs/results/rejudge.py), by the same rule as
    ``claim_verdict``; ``blockers`` / ``flags``: the preconditions and controls, as text."""
    row: dict[str, Any] = {"claim": claim.id, "source": claim.source, "metric": claim.metric,
                           "effect": claim.effect, "effect_source": claim.effect_source}
    _numbers(row, claim, comp)
    row["p_holm"] = comp.p if p_adjusted is None else p_adjusted
    return _finish(row, claim, comp, list(blockers), list(flags), list(signals))


def _signal(s, ca: pd.DataFrame, cb: pd.DataFrame, metrics, claim: Claim) -> str:
    va, vb = _values(s.metric, ca, metrics), _values(s.metric, cb, metrics)
    if va is None or vb is None:
        return f"{s.metric} {s.direction}: not recorded"
    c = compare(_by_seed(ca, va), _by_seed(cb, vb), claim.alpha)
    d = direction_answer(c, 1.0 if s.direction == "higher" else -1.0, c.p, claim.alpha)
    est = f"{c.diff:+.3g}" + (f" [{c.lo:+.3g}, {c.hi:+.3g}]" if math.isfinite(c.lo) else "")
    return f"{s.metric} {s.direction}: {d} ({est})"


def verdict_table(claims: list[Claim], trials: pd.DataFrame,
                  metrics: pd.DataFrame | None = None, min_gap: float = 1.05, *,
                  reference_loss: float | None = None) -> pd.DataFrame:
    """One row per claim (``claim_verdict``), in the spec's order; directions decided on the
    p-values Holm-adjusted over the claims that are not withheld."""
    first = [claim_verdict(c, trials, metrics, min_gap, reference_loss=reference_loss)
             for c in claims]
    live = [i for i, r in enumerate(first)
            if r["verdict"] != UNTESTABLE and math.isfinite(r.get("p_value", NAN))]
    adjusted = dict(zip(live, holm([first[i]["p_value"] for i in live])))
    rows = [claim_verdict(c, trials, metrics, min_gap, reference_loss=reference_loss,
                          p_adjusted=adjusted[i]) if i in adjusted else first[i]
            for i, c in enumerate(claims)]
    return pd.DataFrame(rows)


def load_claims(root: str | Path) -> list[Claim]:
    """The claims of the spec the sweep ran (``<root>/spec.yaml``); none without one. A claim
    written before claims named their source is read as a proxy (never as the paper's)."""
    import yaml

    f = Path(root) / "spec.yaml"
    if not f.exists():
        return []
    raw = yaml.safe_load(f.read_text()) or {}
    out = []
    for c in raw.get("claims") or []:
        if "source" not in c:
            c = {**c, "source": "proxy",
                 "reason": "declared before claims named their source (issue 30)"}
        out.append(Claim(**c))
    return out


_MD_COLS = ["claim", "source", "verdict", "direction", "size", "flags", "reasons", "metric",
            "design", "n_arm", "n_baseline", "diff", "lo", "hi", "p_holm", "mde", "seeds_needed",
            "effect", "diverged_arm", "diverged_baseline", "diverged_fisher_p", "signals",
            "steps_run", "first_loss_worst", "ones_worst", "small_gap", "trained_worst",
            "saturation_worst"]


def write_verdicts(data: SweepData, out: Path, cfg: ReportConfig | None = None) -> list[str]:
    """Write ``out/verdicts.{csv,md}`` for the spec's claims; the report.md lines (none when
    the spec declares no claims)."""
    from orchestrator.analysis.collapse import collapse_ceiling

    cfg = cfg or ReportConfig()
    claims = load_claims(data.root)
    if not claims:
        return []
    ref = collapse_ceiling(data.root).reference
    table = verdict_table(claims, data.trials, data.metrics, cfg.min_gap,
                          reference_loss=ref if math.isfinite(ref) else None)
    table.to_csv(out / "verdicts.csv", index=False)
    cols = [c for c in _MD_COLS if c in table.columns]
    lines = ["## Verdicts", "",
             "Rule (orchestrator/analysis/verdicts.py): two answers per claim. Direction: "
             "confirmed / opposite when the test of arm - baseline (paired by seed, else "
             "Welch; Fisher for divergence rates) rejects 0 at alpha after Holm over the "
             "claims, else undecided (deterministic: zero spread). Size against the effect: "
             "consistent / smaller / larger, or no effect of the claimed size when the "
             "interval lies inside the smallest effect of interest. Not testable here when a "
             "precondition fails (seeds, length, survivors, did it train); a failing control "
             "is a flag beside a paper claim and withholds a proxy's answers. The MDE only "
             "explains an undecided direction. diff = arm - baseline [95% interval].", "",
             _md_table(table[cols]), "",
             "Claims: " + "; ".join(f"**{c.id}** ({c.source}, {c.paper}): {c.text}"
                                    + (f" [proxy: {c.reason}]" if c.reason else "")
                                    for c in claims), ""]
    (out / "verdicts.md").write_text("\n".join(["# Verdicts: " + data.name, ""] + lines[2:]))
    return lines + ["Numbers: [verdicts.csv](verdicts.csv).", ""]
