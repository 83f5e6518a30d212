"""sigma_max(W_Q), the max attention logit and the column-norm spread over training, per Paper B
arm (docs/results.md §0c), from a `manifold_assignment` sweep's Parquet dataset, next to the
bound Muon's spectrally bounded step puts on sigma_max growth (sum of the lr schedule so far).

Run from the repository root:
    PYTHONPATH=. .venv/bin/python docs/results/paper_b_growth.py results/manifold_assignment
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from orchestrator.analysis.load import load_sweep
from orchestrator.spec.yaml_reader import load_spec
from workloads.schedule import lr_at

STEPS = (0, 500, 1000, 1500, 2000)
ROWS = (("w.sigma_max", "q", "sigma_max(W_Q), mean over layers", "mean"),
        ("inst.max_logit", "attn", "max attention logit, max over layers", "max"),
        ("inst.colnorm_spread", "qkv", "column-norm spread of c_attn, max over layers", "max"))


def lr_sum(root: Path) -> dict[int, float]:
    """sum_{t < s} of Muon's lr at each of STEPS: how far sigma_max can have moved from its
    start (Muon's lr follows the AdamW schedule scaled by muon.lr / optim.lr)."""
    o = load_spec(root / "spec.yaml").base_config().optim
    scale = o.muon.lr / o.lr
    total = max(STEPS)
    out, acc = {}, 0.0
    for t in range(total + 1):
        if t in STEPS:
            out[t] = acc
        acc += scale * lr_at(t, o.lr, total, o.warmup_steps, o.schedule, o.min_lr_ratio)
    return out


def main(root: Path) -> None:
    data = load_sweep(root)
    m, t = data.metrics, data.trials
    arm = dict(zip(t["trial"].astype(str), t["arm"].astype(str).str.split("=").str[-1]))
    done = set(t.loc[t["status"] == "completed", "trial"].astype(str))
    bound = lr_sum(root)
    print("sum of Muon's lr up to each step (Muon's bound on sigma_max growth): "
          + ", ".join(f"{s}: {bound[s]:.2f}" for s in STEPS))
    for metric, module, title, agg in ROWS:
        x = m[(m["metric"] == metric) & (m["module"] == module) & m["step"].isin(STEPS)].copy()
        x["trial"] = x["trial"].astype(str)
        x = x[x["trial"].isin(done)]
        if x.empty:
            continue
        x["arm"] = x["trial"].map(arm)
        per_trial = x.groupby(["arm", "trial", "step"])["value"].agg(agg).reset_index()
        tab = per_trial.groupby(["arm", "step"])["value"].agg(["mean", "min", "max", "count"])
        wide = tab["mean"].unstack("step").round(3)
        wide["seeds"] = tab["count"].groupby("arm").max()
        print(f"\n{title} (mean over seeds; columns: step)")
        print(wide.to_string())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: paper_b_growth.py SWEEP_FOLDER")
    pd.set_option("display.width", 160)
    main(Path(sys.argv[1]))
