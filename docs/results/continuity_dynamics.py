"""Paper C's dynamic, per arm: how weight continuity, its all-ones control, the top-1 gap and
gradient continuity move over training (docs/results.md §1).

Reads a sweep's Parquet dataset (the `metrics` table: one row per step, metric, layer pair) and
prints, for every arm and a few steps, the mean over seeds (± the seed SD) of:
  w.top1   mean of w.top1_u and w.top1_v over the adjacent layer pairs (both sides of `hidden`
           are residual sides, docs/metrics.md), what cont/resid_top1_mean summarises at the end;
  w.ones   mean |cos| of the top singular vectors with the all-ones direction (the control);
  s1/s2    median over layers of the top-1 gap (top-1 vectors are defined only if >= 1.05);
  gp.top1  the same mean as w.top1 for the probe-batch gradients (Paper C's gradient continuity).
Usage: python docs/results/continuity_dynamics.py SWEEP_DIR [--steps 0,500,...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds

COLS = {"w.top1": ("w.top1_u", "w.top1_v"), "w.ones": ("w.ones_u", "w.ones_v"),
        "s1/s2": ("w.s1_s2",), "gp.top1": ("gp.top1_u", "gp.top1_v")}


def per_trial(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per (trial, step): each summary above (median for the gap, mean otherwise)."""
    out = []
    for name, keys in COLS.items():
        m = metrics[metrics["metric"].isin(keys)]
        agg = "median" if name == "s1/s2" else "mean"
        out.append(m.groupby(["trial", "step"])["value"].agg(agg).rename(name))
    return pd.concat(out, axis=1).reset_index()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--steps", default="0,500,1000,2000,3000,4000,last")
    a = ap.parse_args(argv)
    root = a.sweep / "parquet"
    if not (root / "metrics").is_dir():
        print(f"error: {root / 'metrics'} is not a sweep's Parquet metrics table", file=sys.stderr)
        return 2
    m = ds.dataset(root / "metrics", partitioning="hive").to_table(
        columns=["trial", "step", "metric", "value"]).to_pandas()
    trials = ds.dataset(root / "trials", partitioning="hive").to_table().to_pandas()
    arm = trials.drop_duplicates("trial", keep="last").set_index("trial")["arm"]
    t = per_trial(m)
    t["arm"] = t["trial"].map(arm)
    last = t.groupby("trial")["step"].transform("max")
    rows = []
    for s in a.steps.split(","):
        sel = t[t["step"] == last] if s == "last" else t[t["step"] == int(s)]
        g = sel.groupby("arm")[list(COLS)]
        mean, sd, n = g.mean(), g.std(), g.size()
        for arm_name in mean.index:
            row = {"arm": arm_name, "step": s, "seeds": int(n[arm_name])}
            row.update({c: f"{mean.loc[arm_name, c]:.3f} ± {sd.loc[arm_name, c]:.3f}"
                        for c in COLS})
            rows.append(row)
    out = pd.DataFrame(rows).sort_values(["arm", "step"], key=lambda c: c.map(
        lambda v: (0, int(v)) if str(v).isdigit() else (1, 0) if v == "last" else (0, v)))
    cols = list(out.columns)
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in out.itertuples(index=False):
        print("| " + " | ".join(str(v) for v in r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
