"""A claim's controls, evaluated for each arm (issue 30): one failing arm fails the comparison,
and the message names it.

Each function takes the compared arms as ``{arm label: its trials}`` and returns the row's
numbers and the failures as ``(control, message)``. Which failures withhold a verdict and which
are shown beside a paper claim's number is orchestrator/analysis/verdicts.py's business.

- ``trained`` ("did it train"): an arm whose completed seeds end at or above the collapse
  ceiling, (1 - MARGIN) x the data's frequency baseline (the context-free loss of the corpus,
  orchestrator/analysis/collapse.py; ln(n_classes), the uniform predictor, when that is not
  known), in more than the claim's ``max_diverged_share`` of its seeds did not train: its loss
  is the plateau's, not the method's.
- ``first_loss``, ``ones``, ``small_gap``, ``saturation``, ``outgrew_init``: as
  orchestrator/spec/claims.py describes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from orchestrator.analysis.collapse import MARGIN
from orchestrator.analysis.tables import _small_gap_share, gap_source
from orchestrator.spec.claims import Claim

__all__ = ["trained", "metric_controls", "ones_columns", "first_loss", "FIRST_LOSS"]

NAN = float("nan")
FIRST_LOSS = ("cont0/probe_loss", "train/initial_loss")  # first-loss columns, preferred first
SATURATION = "stream/frac_beta_gt_half_pi_max"
REL_CHANGE = "cont/rel_change_mean"
Arms = Mapping[str, pd.DataFrame]
Failure = tuple[str, str]


def _num(t: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(t[col], errors="coerce") if col in t.columns else \
        pd.Series(NAN, index=t.index)


def first_loss(t: pd.DataFrame) -> pd.Series:
    out = pd.Series(NAN, index=t.index)
    for col in reversed(FIRST_LOSS):  # the preferred column last, so it wins where present
        if col in t.columns:
            v = pd.to_numeric(t[col], errors="coerce")
            out = v.where(v.notna(), out)
    return out


def ones_columns(metric: str, columns: Iterable[str]) -> list[str]:
    """The all-ones control that belongs to ``metric``: taken at the same time (``cont0/`` at
    step 0, ``cont/`` at the end) and on the same vectors (``grad_ones_*`` for a gradient
    metric, ``ones_*`` for weights). A metric outside that scheme is checked against every
    end-of-training control, weights and gradients."""
    when, _, name = metric.partition("/")
    if when in ("cont", "cont0") and name:
        kind = "grad_ones_" if name.startswith("grad_") else "ones_"
        return [c for c in columns if c.startswith(f"{when}/{kind}")]
    return [c for c in columns if c.startswith(("cont/ones_", "cont/grad_ones_"))]


def trained(claim: Claim, arms: Arms, reference: float | None) -> tuple[dict, list[Failure]]:
    """The "did it train" control on ``final_val_loss`` of each arm's completed trials."""
    ref = reference if reference is not None and math.isfinite(reference) else (
        math.log(claim.n_classes) if claim.n_classes else NAN)
    row = {"trained_reference": ref, "trained_ceiling": ref * (1 - MARGIN)}
    if not math.isfinite(ref):
        return row, [("trained", "did-it-train control: the data's frequency baseline is "
                                 "unknown (give the claim n_classes)")]
    ceiling, fails, worst = ref * (1 - MARGIN), [], NAN
    for label, t in arms.items():
        v = _num(t, "final_val_loss").dropna()
        if v.empty:
            continue
        collapsed = int((v >= ceiling).sum())
        worst = float(np.nanmax([worst, v.mean()]))
        if collapsed / len(v) > claim.max_diverged_share:
            fails.append(("trained", f"{label} did not train: {collapsed}/{len(v)} seeds end "
                          f"at or above the collapse ceiling {ceiling:.4g} ({1 - MARGIN:g} x "
                          f"the frequency baseline {ref:.4g}; final val loss {v.mean():.4g})"))
    row["trained_worst"] = worst
    return row, fails


def metric_controls(claim: Claim, arms: Arms, metrics: pd.DataFrame | None,
                    min_gap: float) -> tuple[dict, list[Failure]]:
    """The claim's listed controls, each arm on its own."""
    row: dict = {}
    fails: list[Failure] = []
    for name in claim.controls:
        r, f = _CONTROLS[name](claim, arms, metrics, min_gap)
        row.update(r)
        fails += f
    return row, fails


def _first_loss(claim: Claim, arms: Arms, metrics, min_gap) -> tuple[dict, list[Failure]]:
    target = math.log(claim.n_classes or 2)
    fails, worst, worst_dev = [], NAN, -1.0
    seen = False
    for label, t in arms.items():
        first = first_loss(t).dropna()
        if first.empty:
            continue
        seen = True
        dev = np.abs(first / target - 1)
        i = int(np.argmax(dev))
        if dev.iloc[i] > worst_dev:
            worst_dev, worst = float(dev.iloc[i]), float(first.iloc[i])
        if dev.iloc[i] > claim.first_loss_tol:
            fails.append(("first_loss", f"first loss {first.iloc[i]:.4g} in {label} far from "
                          f"ln({claim.n_classes}) = {target:.4g}"))
    if not seen:
        fails.append(("first_loss", "first loss not recorded"))
    return {"first_loss_target": target, "first_loss_worst": worst}, fails


def _ones(claim: Claim, arms: Arms, metrics, min_gap) -> tuple[dict, list[Failure]]:
    fails, worst = [], NAN
    for label, t in arms.items():
        cols = ones_columns(claim.metric, t.columns)
        per = t[cols].apply(pd.to_numeric, errors="coerce").mean() if cols else pd.Series()
        per = per[np.isfinite(per)] if len(per) else per
        if per.empty:
            continue
        worst = float(np.nanmax([worst, per.max()]))
        if per.max() > claim.ones_max:
            fails.append(("ones", f"all-ones control high in {label} ({per.max():.3g} > "
                          f"{claim.ones_max}: {per.idxmax()})"))
    if not math.isfinite(worst):
        fails.append(("ones", "all-ones control not recorded"))
    return {"ones_worst": worst}, fails


def _small_gap(claim: Claim, arms: Arms, metrics, min_gap) -> tuple[dict, list[Failure]]:
    m = metrics if metrics is not None else pd.DataFrame()
    source, at = gap_source(claim.metric)
    fails, worst = [], NAN
    for label, t in arms.items():
        gap = _small_gap_share(m, t["trial"], min_gap, source, at) if "trial" in t else {}
        if not gap:
            continue
        share = float(np.mean(list(gap.values())))
        worst = float(np.nanmax([worst, share]))
        if share >= 0.5:
            fails.append(("small_gap", f"top-1 degenerate in {label}: {share:.0%} of matrices "
                          f"have s1/s2 < {min_gap}"))
    if not math.isfinite(worst):
        fails.append(("small_gap", "s1/s2 not recorded"))
    return {"small_gap": worst}, fails


def _saturation(claim: Claim, arms: Arms, metrics, min_gap) -> tuple[dict, list[Failure]]:
    fails, worst = [], NAN
    for label, t in arms.items():
        v = _num(t, SATURATION).dropna()
        if v.empty:
            continue  # not a sphere family: nothing saturates
        worst = float(np.nanmax([worst, v.mean()]))
        if v.mean() > claim.saturation_max:
            fails.append(("saturation", f"step saturated in {label}: {v.mean():.0%} of tokens "
                          f"have beta > pi/2 in the worst sublayer (limit "
                          f"{claim.saturation_max:.0%}): each sublayer overwrites the stream"))
    return {"saturation_worst": worst}, fails


def _outgrew_init(claim: Claim, arms: Arms, metrics, min_gap) -> tuple[dict, list[Failure]]:
    fails, worst = [], NAN
    for label, t in arms.items():
        v = _num(t, REL_CHANGE).dropna()
        if v.empty:
            fails.append(("outgrew_init", f"{REL_CHANGE} not recorded in {label}"))
            continue
        worst = float(np.nanmin([worst, v.min()]))
        if v.min() < 1.0:
            fails.append(("outgrew_init", f"the update has not outgrown the init in {label}: "
                          f"||W_t - W_0|| / ||W_0|| = {v.min():.3g} < 1 (Paper C's condition)"))
    return {"rel_change_min": worst}, fails


_CONTROLS = {"first_loss": _first_loss, "ones": _ones, "small_gap": _small_gap,
             "saturation": _saturation, "outgrew_init": _outgrew_init}
