"""Paper C's init-scale and optimiser arms, each against its block's default (docs/results.md §0d).

`continuity_mlp` runs, for Res+ReLU and for Res+None, the default (Adam 1e-3, beta2 0.999,
depth-scaled init) beside five variants: init scale x {0.25, 0.5, 2}, Adam with beta1 = beta2 = 0
(sign descent) and SGD with momentum 0.9 at lr 0.01. No claim is declared for them, so this
script describes, it does not judge: for every arm it prints the mean [95% t-interval] over
seeds of the end-of-training values and the paired-by-seed difference from its block's default
with the pooled minimum detectable effect (alpha 0.05, power 0.8; the verdict rule's MDE).

Columns (trial summaries, docs/metrics.md; "end" = the last step):
  val          final val loss;  first: the first training batch's loss (ln 10 = 2.30)
  w.top1       cont/resid_top1_mean, weight continuity (M1, top-1, adjacent layers), end
  ones         cont/ones_u_mean / cont/ones_v_mean, the all-ones control of w.top1, end
  wc.top1      cont/resid_ctop1_mean, the all-ones-blind (centred) continuity, end
  wc.peak      the largest wc.top1 over the logged steps (layer-pair mean), and its step:
               "forms, then loses" shows as a peak well above the end value
  wc.d10       cont/resid_ctop1_d10_mean, centred continuity at layer distance 10
  M7           cont/self0_resid_mean, |cos| of each layer's top vectors with its own at init
  gap<1.05     share of centred matrices whose s1/s2 < 1.05 at the end (top-1 ill-defined)
Usage: PYTHONPATH=. python docs/results/continuity_arms.py SWEEP_DIR [RERUN_DIR ...] [--csv OUT.csv]
A RERUN_DIR holds trials re-run under the final spec (same arm labels): each replaces the first
sweep's trial of the same arm and seed, with its metric rows.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from orchestrator.analysis.load import load_sweep
from orchestrator.analysis.stats import mde, paired_difference, pooled_sd, t_interval

DEFAULT = {"model.init_scale": 1.0, "optim.name": "adamw", "optim.beta2": 0.999}
VARIANTS = {  # label -> the keys that differ from DEFAULT (others as DEFAULT, or absent)
    "default (Adam, init x1)": DEFAULT,
    "init x0.25": {"model.init_scale": 0.25},
    "init x0.5": {"model.init_scale": 0.5},
    "init x2": {"model.init_scale": 2.0},
    "Adam b1=b2=0 (sign)": {"model.init_scale": 1.0, "optim.name": "adamw", "optim.beta2": 0.0},
    "SGD mom 0.9, lr 0.01": {"model.init_scale": 1.0, "optim.name": "sgd"},
}
BLOCKS = {"Res+ReLU": "relu", "Res+None": "none"}
METRICS = {"val": "final_val_loss", "first": "train/initial_loss",
           "w.top1": "cont/resid_top1_mean", "ones_u": "cont/ones_u_mean",
           "ones_v": "cont/ones_v_mean", "wc.top1": "cont/resid_ctop1_mean",
           "wc.d10": "cont/resid_ctop1_d10_mean", "M7": "cont/self0_resid_mean"}
COMPARED = ("val", "w.top1", "wc.top1", "M7")  # the columns given a paired difference


def _select(t: pd.DataFrame, activation: str, keys: dict) -> pd.DataFrame:
    ok = (t["model.skip"].astype(str).str.lower() == "true") & (t["model.activation"] == activation)
    for k, v in keys.items():
        col = t[k]
        ok &= col.astype(str).eq(str(v)) if isinstance(v, str) else pd.to_numeric(
            col, errors="coerce").sub(v).abs().lt(1e-12)
    return t[ok]


def centred_curve(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per (trial, step): the mean over layer pairs and both sides of wc.top1."""
    m = metrics[metrics["metric"].isin(("wc.top1_u", "wc.top1_v"))]
    return m.groupby(["trial", "step"])["value"].mean().rename("wc").reset_index()


def small_gap_share(metrics: pd.DataFrame) -> pd.Series:
    """trial -> share of centred hidden matrices with s1/s2 < 1.05 at its last step."""
    g = metrics[metrics["metric"] == "wc.s1_s2"]
    g = g[g["step"] == g.groupby("trial")["step"].transform("max")]
    return (g["value"] < 1.05).groupby(g["trial"]).mean()


def _ci(v: pd.Series) -> str:
    m, lo, hi = t_interval(v.dropna())
    return "-" if math.isnan(m) else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def _diff(a: pd.Series, b: pd.Series) -> str:
    """a - b paired by seed, then the pooled MDE of the two arms."""
    r = paired_difference(a, b)
    a, b = a.dropna(), b.dropna()
    sp = pooled_sd(float(a.std()), len(a), float(b.std()), len(b))
    d = mde(sp, len(a), nb=len(b)) if len(a) > 1 and len(b) > 1 and not math.isnan(sp) else math.nan
    return f"{r.mean:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}] (MDE {d:.3f})"


def load(sweeps: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trials, metric rows) of the first sweep, with each later sweep's trials replacing the
    ones of the same arm and seed (a re-run under the final spec)."""
    trials, metrics = [], []
    for k, sweep in enumerate(sweeps):  # trial ids prefixed by the sweep's position: unique
        d = load_sweep(sweep)
        new = d.trials.assign(trial=f"{k}/" + d.trials["trial"].astype(str))
        key = set(zip(new["arm"], new["seed"]))
        for i, old in enumerate(trials):
            gone = old[[(a, s) in key for a, s in zip(old["arm"], old["seed"])]]["trial"]
            trials[i] = old[~old["trial"].isin(gone)]
            metrics[i] = metrics[i][~metrics[i]["trial"].isin(gone)]
        trials.append(new)
        metrics.append(d.metrics.assign(trial=f"{k}/" + d.metrics["trial"].astype(str)))
    return pd.concat(trials, ignore_index=True), pd.concat(metrics, ignore_index=True)


def table(sweeps: list[Path]) -> pd.DataFrame:
    trials, metrics = load(sweeps)
    t = trials[trials["status"] == "completed"].copy()
    curve = centred_curve(metrics)
    peak = curve.loc[curve.groupby("trial")["wc"].idxmax()].set_index("trial")
    gap = small_gap_share(metrics)
    rows = []
    for block, act in BLOCKS.items():
        base = _select(t, act, DEFAULT).set_index("seed")
        for label, keys in VARIANTS.items():
            arm = _select(t, act, keys).set_index("seed")
            if arm.empty:
                continue
            row = {"block": block, "arm": label, "seeds": len(arm)}
            for name, col in METRICS.items():
                row[name] = _ci(arm[col])
            pk = peak.reindex(arm["trial"])
            row["wc.peak (step)"] = f"{pk['wc'].mean():.3f} ({pk['step'].median():.0f})"
            row["gap<1.05"] = f"{gap.reindex(arm['trial']).mean():.0%}"
            if keys is not DEFAULT:
                for name in COMPARED:
                    row[f"d {name}"] = _diff(arm[METRICS[name]], base[METRICS[name]])
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", type=Path, nargs="+", metavar="SWEEP_DIR")
    ap.add_argument("--csv", type=Path, help="also write the table here")
    a = ap.parse_args(argv)
    for sweep in a.sweeps:
        if not (sweep / "parquet" / "trials").is_dir():
            print(f"error: {sweep} holds no sweep's Parquet trials table", file=sys.stderr)
            return 2
    out = table(a.sweeps)
    if out.empty:
        print("error: no completed init-scale or optimiser arm in this sweep", file=sys.stderr)
        return 2
    with pd.option_context("display.max_columns", None, "display.width", 250,
                           "display.max_colwidth", 60):
        for block, g in out.groupby("block", sort=False):
            print(f"\n== {block}")
            print(g.drop(columns="block").set_index("arm").T.to_string())
    if a.csv:
        out.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
