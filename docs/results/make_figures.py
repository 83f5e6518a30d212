"""Extra figures of docs/results.md, drawn from the sweeps' Parquet datasets.

The report's own figures (``geosweep report DIR``) are copied next to these; this script adds
the views the report does not draw. Run from the repository root:

    python docs/results/make_figures.py results docs/results
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from orchestrator.store.parquet import read_curves, read_metrics, read_trials  # noqa: E402

__all__ = ["norm_early_loss", "norm_final_vs_lr", "mlp_coherence", "main"]

FAMILIES = ["pre_ln", "post_ln", "peri_ln", "pre_dyt", "keel", "geonorm", "spheret"]
# Entropy of the character unigram distribution of the 200k-token training corpus (nats):
# a model that only learns character frequencies sits here.
UNIGRAM_NATS = 3.354


def _with_params(df: pd.DataFrame, trials: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df.merge(trials[["trial", "seed", "status", *cols]], on="trial")


def norm_early_loss(root: Path, out: Path) -> None:
    """Train loss of the first 40 steps at lr 1.0, mean over seeds, one line per family."""
    t = read_trials(str(root / "norm_ablation/parquet"))
    c = _with_params(read_curves(str(root / "norm_ablation/parquet")), t,
                     ["model.residual.family", "optim.lr"])
    c = c[(c["optim.lr"] == 1.0) & (c.split == "train") & (c.metric == "loss") & (c.step <= 40)]
    fig, ax = plt.subplots(figsize=(7, 4))
    for fam in FAMILIES:
        g = c[c["model.residual.family"] == fam].groupby("step").value.mean()
        ax.plot(g.index, g.values, label=fam, marker=".", ms=3)
    bound = float(t.loc[t["optim.lr"] == 1.0, "train/initial_loss"].mean()) + 2.0
    ax.axhline(bound, color="k", ls="--", lw=0.8, label="initial + 2 (loss_vs_initial)")
    ax.axvline(20, color="grey", ls=":", lw=0.8, label="rule warm-up (20 steps)")
    ax.set(yscale="log", xlabel="step", ylabel="train loss (mean of 3 seeds)",
           title="norm_ablation, lr = 1.0: first 40 steps")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "norm_ablation/lr1_first40.png", dpi=110)
    plt.close(fig)


def norm_final_vs_lr(root: Path, out: Path) -> None:
    """Final val loss of every seed per family and lr; diverged trials drawn as x at the top."""
    t = read_trials(str(root / "norm_ablation/parquet"))
    lrs = sorted(t["optim.lr"].unique())
    fig, ax = plt.subplots(figsize=(8, 4))
    top = 3.75
    for i, fam in enumerate(FAMILIES):
        for j, lr in enumerate(lrs):
            g = t[(t["model.residual.family"] == fam) & (t["optim.lr"] == lr)]
            x = i + (j - 1) * 0.25
            ok = g[g.status == "completed"]
            ax.scatter([x] * len(ok), ok.final_val_loss, s=14, color=f"C{j}",
                       label=f"lr {lr:g}" if i == 0 else None)
            nd = int((g.status == "diverged").sum())
            if nd:
                ax.scatter([x], [top], marker="x", color=f"C{j}", s=30)
                ax.annotate(f"{nd}/3", (x, top), xytext=(0, -12), textcoords="offset points",
                            ha="center", fontsize=7)
    ax.axhline(UNIGRAM_NATS, color="k", ls="--", lw=0.8, label="char unigram entropy")
    ax.set_xticks(range(len(FAMILIES)), FAMILIES)
    ax.set(ylabel="final val loss (nats)", ylim=(2.4, 3.85),
           title="norm_ablation: final val loss per seed (x = diverged, count below)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "norm_ablation/final_val_vs_lr.png", dpi=110)
    plt.close(fig)


def mlp_coherence(root: Path, out: Path) -> None:
    """Gradient coherence g.coh (adjacent layers) and cg.top1_v per arm over steps."""
    p = str(root / "continuity_mlp/parquet")
    t = read_trials(p)
    m = _with_params(read_metrics(p), t, ["arm"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    # g.coh at step 0 (initialisation), then g.coh_mean (mean over the steps since the last collect)
    coh = m[((m.metric == "g.coh") & (m.step == 0)) | (m.metric == "g.coh_mean")]
    panels = [("g.coh", coh), ("cg.top1_v", m[m.metric == "cg.top1_v"]),
              ("w.top1_v", m[m.metric == "w.top1_v"])]
    for ax, (title, x) in zip(axes, panels):
        for i, (arm, g) in enumerate(x.groupby("arm")):
            s = g.groupby(["step", "seed"]).value.mean().groupby("step")
            ax.plot(s.mean().index, s.mean().values, color=f"C{i}", marker=".", label=_short(arm))
            ax.fill_between(s.min().index, s.min().values, s.max().values, color=f"C{i}",
                            alpha=0.15)
        if title != "g.coh":
            b = m[m.metric == "base." + title.split(".")[1]].value.mean()
            ax.axhline(b, color="k", ls="--", lw=0.8, label="random baseline")
        ax.set(title=f"{title}, mean of 15 layer pairs", xlabel="step")
    axes[0].legend(fontsize=7)
    fig.suptitle("continuity_mlp: mean over seeds, band = min-max over seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "continuity_mlp/coherence_continuity.png", dpi=110)
    plt.close(fig)


def _short(arm: str) -> str:
    if "skip=false" in arm:
        return "NoRes (ReLU)"
    act = arm.split("activation=")[-1]
    return "Res+none (under Res+radial)" if act == "none" else "Res+" + act


def main(argv: list[str]) -> None:
    root, out = Path(argv[0]), Path(argv[1])
    for sub in ("norm_ablation", "continuity_mlp"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    norm_early_loss(root, out)
    norm_final_vs_lr(root, out)
    mlp_coherence(root, out)


if __name__ == "__main__":
    main(sys.argv[1:])
