"""The report's figures (matplotlib Agg canvas, no pyplot state): loss curves, validation loss
vs p (analysis/val_vs_p.py), continuity heatmaps, growth panels. A figure whose rows are absent
is skipped with one line, not an error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.arm_labels import arm_names
from orchestrator.analysis.load import ReportConfig, SweepData, arm_order, curves_of
from orchestrator.analysis.tables import _match
from orchestrator.analysis.timing import stage
from orchestrator.analysis.val_vs_p import fig_val_vs_p

# --- figures -------------------------------------------------------------------------------


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colors(arms: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(arms) <= 10 else "tab20"]
    return {a: cmap(i % cmap.N) for i, a in enumerate(arms)}


def _arm_lines(ax, df: pd.DataFrame, data: SweepData, arms: list[str], labels: dict,
               colors: dict, band: str) -> int:
    """Mean over seeds and a seed band per arm; ``df`` has trial, step, value."""
    df = df.merge(data.trials[["trial", "arm"]], on="trial")
    drawn = 0
    for arm in arms:
        g = df[df["arm"] == arm]
        piv = g.pivot_table(index="step", columns="trial", values="value", aggfunc="mean")
        if piv.empty:
            continue
        piv = piv.sort_index()
        mean = piv.mean(axis=1)
        if band == "std":
            sd = piv.std(axis=1).fillna(0.0)
            lo, hi = mean - sd, mean + sd
        else:
            lo, hi = piv.min(axis=1), piv.max(axis=1)
        ax.plot(mean.index, mean.to_numpy(), color=colors[arm], label=labels[arm], lw=1.2)
        ax.fill_between(mean.index, lo.to_numpy(), hi.to_numpy(), color=colors[arm],
                        alpha=0.2, lw=0)
        drawn += 1
    return drawn


MAX_CURVE_ARMS = 12  # more lines than a legend can name: the best arms are drawn
MAX_POINTS = 500  # points per curve drawn: steps are averaged in bins above that


def _best_arms(data: SweepData, arms: list[str], k: int) -> list[str]:
    """At most ``k`` arms, the best first by mean final val loss of completed trials."""
    if len(arms) <= k:
        return arms
    t = data.trials[data.trials["status"] == "completed"]
    mean = t.groupby("arm")["final_val_loss"].mean()
    pos = {a: i for i, a in enumerate(arms)}
    order = sorted(arms, key=lambda a: (not np.isfinite(mean.get(a, np.nan)),
                                        mean.get(a, np.nan), pos[a]))
    return order[:k]


def _thin(d: pd.DataFrame) -> pd.DataFrame:
    """Mean over step bins so that a curve has at most MAX_POINTS points (10,000 steps:
    bins of 20; a plot cannot show more, and Agg draws 1,000s of lines x 10,000 points in
    minutes)."""
    if d.empty:
        return d
    width = int(np.ceil((int(d["step"].max()) + 1) / MAX_POINTS))
    if width <= 1:
        return d
    d = d.assign(step=(d["step"] // width + 1) * width)
    return d.groupby(["trial", "step"], as_index=False, observed=True)["value"].mean()


def _fig_loss_curves(data: SweepData, cfg: ReportConfig, arms, labels, colors, path) -> str | None:
    arms = _best_arms(data, arms, MAX_CURVE_ARMS)  # a search has an arm per trial
    keep = data.trials.loc[data.trials["arm"].isin(arms), "trial"]
    c = curves_of(data, keep)  # only the drawn arms' trials are read
    c = c[c["metric"] == "loss"] if not c.empty else c
    splits = [s for s in ("train", "val") if not c.empty and (c["split"] == s).any()]
    if not splits:
        return "loss curves: no train/val loss rows in curves/"
    fig = _figure(5.5 * len(splits), 4.5)
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    for ax, split in zip(axes, splits):
        d = _thin(c[c["split"] == split][["trial", "step", "value"]])
        _arm_lines(ax, d, data, arms, labels, colors, cfg.band)
        v = d["value"].dropna()
        lo, hi = float(v.min()), float(v.quantile(0.995))  # a diverged seed must not flatten all
        if hi > lo:
            ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set(title=f"{split} loss", xlabel="step", ylabel="loss")
        ax.grid(alpha=0.3)
    band = "min-max" if cfg.band == "minmax" else "+-1 std"
    best = f", the {len(arms)} best arms" if len(arms) < len(labels) else ""
    kept = data.trials[data.trials["arm"].isin(arms)]
    if kept.groupby("arm")["seed"].nunique().max() > 1:
        fig.suptitle(f"{data.name}: mean over seeds, band = {band} over seeds{best}")
    else:  # one seed per arm: a band would be a line's own width
        fig.suptitle(f"{data.name}: one seed per arm (no band){best}")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(3, len(names)), fontsize=7)
    fig.savefig(path)
    return None


def _spread(n: int, k: int) -> np.ndarray:
    """At most k evenly spread indices of 0..n-1 (tick positions)."""
    return np.unique(np.linspace(0, n - 1, min(k, n)).round()).astype(int)


# roles in reading order (docs/contracts.md); unknown modules follow alphabetically
_ROLE_ORDER = ("q", "k", "v", "qkv", "o", "fc", "proj", "gate", "up", "down", "hidden",
               "in", "out", "attn")


def _module_order(modules) -> list[str]:
    def key(m: str):
        role = m.split("_")[-1]
        return (_ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER), m)

    return sorted(modules, key=key)


def _random_baselines(m: pd.DataFrame, name: str) -> dict[str, float]:
    """module -> mean of the ``base.*`` rows logged next to ``name`` (SCIENCE M1: always show
    the random baseline with the value)."""
    if "." not in name:
        return {}
    b = m[m["metric"] == "base." + name.split(".", 1)[1]]
    return b.groupby("module")["value"].mean().to_dict()


def _fig_heatmaps(data: SweepData, cfg: ReportConfig, arms, labels, out: Path):
    made, skipped = [], []
    m = data.metrics
    if m.empty:
        return made, ["continuity heatmaps: no metric rows in metrics/"]
    names = sorted(set(m.loc[_match(m["metric"], cfg.heatmap_metrics), "metric"]))
    if not names:
        return made, [f"continuity heatmaps: no metric matches {list(cfg.heatmap_metrics)}"]
    for name in names:
        d = m[m["metric"] == name].merge(data.trials[["trial", "arm"]], on="trial")
        in_d = set(d["arm"])
        present = [a for a in arms if a in in_d]
        shown = present[: cfg.max_heatmap_arms]
        if len(shown) < len(present):
            skipped.append(f"heatmap {name}: showing the first {len(shown)} of "
                           f"{len(present)} arms")
        modules = _module_order(d["module"].unique())
        rand = _random_baselines(m, name)
        agg = d.groupby(["arm", "module", "layer", "next_layer", "step"])["value"].mean()
        vmin, vmax = float(agg.min()), float(agg.max())
        pairs = d.groupby(["layer", "next_layer"]).ngroups  # rows of each panel
        fig = _figure(1.6 + 2.4 * len(modules), 0.9 + (1.7 if pairs > 1 else 0.75) * len(shown))
        axes = fig.subplots(len(shown), len(modules), squeeze=False)
        im = None
        for i, arm in enumerate(shown):
            for j, mod in enumerate(modules):
                ax = axes[i][j]
                if (arm, mod) not in agg.index.droplevel([2, 3, 4]):
                    ax.set_axis_off()
                    continue
                piv = agg.loc[(arm, mod)].unstack("step")  # (layer, next_layer) x step
                im = ax.imshow(piv.to_numpy(), aspect="auto", origin="lower", vmin=vmin,
                               vmax=vmax, cmap="viridis", interpolation="nearest")
                ylab = [f"{a}-{b}" if b >= 0 else f"{a}" for a, b in piv.index]
                yt = _spread(len(ylab), 6)
                ax.set_yticks(yt, [ylab[k] for k in yt], fontsize=6)
                xt = _spread(piv.shape[1], 4)
                ax.set_xticks(xt, [str(piv.columns[k]) for k in xt], fontsize=6)
                if i == 0:
                    note = f" (random {rand[mod]:.2g})" if mod in rand else ""
                    ax.set_title(mod + note, fontsize=8)
                if j == 0:  # one row per panel: the name reads across, not up
                    ax.set_ylabel(labels[arm], fontsize=7, rotation=0 if pairs == 1 else 90,
                                  ha="right" if pairs == 1 else "center", va="center")
        if im is not None:
            fig.colorbar(im, ax=axes, shrink=0.8, label=name)
        fig.suptitle(f"{name}: layer pair x step per module, mean over seeds", fontsize=9)
        fname = f"heatmap_{name.replace('.', '_')}.png"
        fig.savefig(out / fname)
        made.append((f"Continuity heatmap `{name}`", fname))
    return made, skipped


def _fig_growth(data: SweepData, cfg: ReportConfig, arms, labels, colors, path):
    m, panels, skipped = data.metrics, [], []
    for title, (mpats, modpats) in cfg.growth.items():
        found = None
        for pat in mpats:  # the first pattern with rows wins: never mix two definitions
            if m.empty:
                break
            d = m[_match(m["metric"], (pat,)) & _match(m["module"].fillna(""), modpats)]
            if len(d):
                found = (f"{title} [{pat}]", d)
                break
        if found is None:
            skipped.append(f"{title} growth: no metric rows match {list(mpats)} "
                           f"with module in {list(modpats)}")
        else:
            panels.append(found)
    if not panels:
        return None, skipped
    fig = _figure(5.5 * len(panels), 4.5)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, d) in zip(axes, panels):
        per = d.groupby(["trial", "step"], as_index=False)["value"].max()  # max over layers
        _arm_lines(ax, per, data, arms, labels, colors, cfg.band)
        v = per["value"].dropna()
        if len(v) and v.min() > 0 and v.max() > 10 * v.min():  # growth over decades
            ax.set_yscale("log")
        ax.set(title=f"{title}, max over layers", xlabel="step")
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(3, len(names)), fontsize=7)
    fig.suptitle(f"{data.name}: growth per arm, mean and seed band")
    fig.savefig(path)
    return ("sigma_max(W_Q) and max-logit growth", path.name), skipped


def draw_figures(data: SweepData, cfg: ReportConfig, out: Path):
    """All figures into ``out``: ([(title, file name)], [one line per skipped figure])."""
    arms = arm_order(data.trials)
    labels, colors = arm_names(arms), _colors(arms)
    made, skipped = [], []
    with stage("figure loss curves"):
        why = _fig_loss_curves(data, cfg, arms, labels, colors, out / "loss_curves.png")
    made += [] if why else [("Loss curves per arm", "loss_curves.png")]
    skipped += [why] if why else []
    with stage("figure val vs p"):
        why = fig_val_vs_p(data, cfg, arms, colors, out / "val_vs_p.png")
    made += [] if why else [("Validation loss vs p", "val_vs_p.png")]
    skipped += [why] if why else []
    with stage("figure heatmaps"):
        hm, sk = _fig_heatmaps(data, cfg, arms, labels, out)
    made, skipped = made + hm, skipped + sk
    with stage("figure growth"):
        g, sk = _fig_growth(data, cfg, arms, labels, colors, out / "growth.png")
    made, skipped = made + ([g] if g else []), skipped + sk
    return made, skipped
