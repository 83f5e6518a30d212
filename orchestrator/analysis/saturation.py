"""The saturation control over training (issue 30): SpheretNorm/GeoNorm's normalised step
beta per arm and report step, from the ``stream.*`` rows the loop writes at every report.

beta = ||a_k z|| / ||h|| is how far one sublayer turns the stream. Past pi/2 the p = 1 angle
saturates at its bound and the sublayer overwrites the stream instead of turning it; the
share of tokens there (``stream.frac_beta_gt_half_pi``) is the signal. Per trial and step the
worst sublayer counts (max over k); per arm, the mean over seeds.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["beta_table", "write_saturation"]

_ROWS = {"stream.beta_mean": "beta_max", "stream.frac_beta_gt_half_pi": "saturated_share"}


def beta_table(trials: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """arm, step, seeds, beta_max (mean over seeds of the worst sublayer's mean beta),
    saturated_share (the same for the share of tokens with beta > pi/2)."""
    cols = ["arm", "step", "seeds", *_ROWS.values()]
    if metrics is None or metrics.empty or "metric" not in metrics.columns:
        return pd.DataFrame(columns=cols)
    m = metrics[metrics["metric"].isin(_ROWS)]
    if m.empty:
        return pd.DataFrame(columns=cols)
    worst = m.groupby(["trial", "step", "metric"])["value"].max().unstack("metric")
    worst = worst.rename(columns=_ROWS).reset_index()
    arm = trials.set_index(trials["trial"].astype(str))["arm"]
    worst["arm"] = worst["trial"].astype(str).map(arm)
    out = worst.groupby(["arm", "step"]).agg(
        seeds=("trial", "nunique"), **{v: (v, "mean") for v in _ROWS.values()
                                       if v in worst.columns}).reset_index()
    return out[[c for c in cols if c in out.columns]]


def write_saturation(trials: pd.DataFrame, metrics: pd.DataFrame, out: Path,
                     md_table) -> list[str]:
    """``out/beta.csv`` and the report.md lines: the share of saturated tokens per arm at each
    report step (arms with no sphere family have no rows); nothing when no arm logs beta."""
    tab = beta_table(trials, metrics)
    if tab.empty:
        return []
    tab.to_csv(out / "beta.csv", index=False)
    steps = sorted(tab["step"].unique())
    pick = steps if len(steps) <= 8 else [steps[i * (len(steps) - 1) // 7] for i in range(8)]
    wide = tab[tab["step"].isin(pick)].pivot(index="arm", columns="step",
                                             values="saturated_share")
    wide.columns = [f"step {s}" for s in wide.columns]
    return ["## Step saturation (SpheretNorm / GeoNorm)", "",
            "Share of tokens whose normalised step beta exceeds pi/2 in the worst sublayer, "
            "mean over seeds: near 1, every sublayer overwrites the stream (the p = 1 angle at "
            "its bound). Per step and arm, with the worst mean beta: "
            "[beta.csv](beta.csv)", "", md_table(wide.reset_index()), ""]
