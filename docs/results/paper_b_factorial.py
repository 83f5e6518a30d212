"""Paper B's four constrained arms read as a 2 x 2 design (docs/results.md §0c): the manifold
of the attention matrices (Stiefel or DGram) x the manifold of the MLP matrices, on the final
val loss, paired by seed (`init_match` starts every arm of a seed from the same matrices).

    all_stiefel = (S, S)   hetero = (S attn, D MLP)
    hetero_inv = (D attn, S MLP)   all_dgram = (D, D)

Per seed: MLP effect = mean of the DGram-MLP arms - mean of the Stiefel-MLP arms, attention
effect likewise, interaction = half the difference of the MLP effect under DGram and under
Stiefel attention. Each with a 95% t-interval over seeds.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python docs/results/paper_b_factorial.py <sweep folder>
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from orchestrator.analysis.load import load_sweep
from orchestrator.analysis.stats import t_interval

ARMS = ("unconstrained", "all_stiefel", "hetero", "hetero_inv", "all_dgram")


def final_losses(root: Path) -> pd.DataFrame:
    """Final val loss of every completed trial: rows seed, columns assignment."""
    t = load_sweep(root).trials
    t = t[t["status"] == "completed"].copy()
    t["assignment"] = t["arm"].astype(str).str.split("=").str[-1]
    return t.pivot_table(index="seed", columns="assignment", values="final_val_loss")


def contrasts(w: pd.DataFrame) -> dict[str, pd.Series]:
    """Per-seed contrasts of the 2 x 2 (seeds with all four constrained arms)."""
    missing = [a for a in ARMS[1:] if a not in w]
    if missing:
        sys.exit(f"no completed trial of {', '.join(missing)}: no 2 x 2 to read")
    w = w.dropna(subset=list(ARMS[1:]))
    s, h, hi, d = w["all_stiefel"], w["hetero"], w["hetero_inv"], w["all_dgram"]
    return {"MLP DGram - MLP Stiefel": (h + d - s - hi) / 2,
            "attention DGram - attention Stiefel": (hi + d - s - h) / 2,
            "interaction (MLP effect under DGram attention - under Stiefel) / 2":
                (d - hi - h + s) / 2}


def main(root: Path) -> None:
    w = final_losses(root)
    print("final val loss per assignment (mean [95% t-interval], seeds)")
    for arm in ARMS:
        if arm in w:
            m, lo, hi = t_interval(w[arm].dropna())
            print(f"  {arm:14s} {m:.4f} [{lo:.4f}, {hi:.4f}]  n={w[arm].notna().sum()}")
    print("\n2 x 2 contrasts, paired by seed (mean [95% t-interval])")
    for name, c in contrasts(w).items():
        m, lo, hi = t_interval(c)
        print(f"  {name}: {m:+.4f} [{lo:+.4f}, {hi:+.4f}]  n={len(c)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: paper_b_factorial.py SWEEP_FOLDER")
    main(Path(sys.argv[1]))
