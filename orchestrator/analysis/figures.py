"""The report's figures (matplotlib Agg canvas, no pyplot state): loss curves, validation loss
vs p, continuity heatmaps, growth panels. A figure whose rows are absent is skipped with one
line, not an error."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.load import ReportConfig, SweepData, arm_order, curves_of
from orchestrator.analysis.stats import t_interval
from orchestrator.analysis.tables import _match
from orchestrator.analysis.timing import stage

# --- figures -------------------------------------------------------------------------------


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _parse_arm(arm: str) -> dict[str, str] | None:
    pairs = arm.split(",")
    if not all("=" in p for p in pairs):
        return None
    return dict(p.split("=", 1) for p in pairs)


def short_labels(arms: list[str], drop: str | None = None) -> dict[str, str]:
    """Legend labels: the ``key=value`` pairs that differ between arms, keys shortened to their
    last dotted part; ``drop`` removes one key (the x axis). Full labels when ambiguous."""
    parsed = [_parse_arm(a) for a in arms]
    if any(kv is None for kv in parsed):
        return {a: a for a in arms}
    keys = list(dict.fromkeys(k for kv in parsed for k in kv))
    vary = [k for k in keys if k != drop and len({kv.get(k) for kv in parsed}) > 1]
    out = {a: " ".join(f"{k.split('.')[-1]}={kv[k]}" for k in vary if k in kv)
           for a, kv in zip(arms, parsed)}
    if drop is None and (len(set(out.values())) < len(arms) or not all(out.values())):
        return {a: a for a in arms}
    return out


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
    fig.suptitle(f"{data.name}: mean over seeds, band = {band} over seeds{best}")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(3, len(names)), fontsize=7)
    fig.savefig(path)
    return None


def _draw_p_series(ax, g: pd.DataFrame, x_of, color, name: str, i: int, conf: float) -> None:
    """One series of the val-loss-vs-p figure (``i``-th): completed points, their mean and CI
    per p, ASHA-stopped trials (@step) and diverged ones (x marks stacked from the top)."""
    done = g[g["status"] == "completed"]
    ax.scatter(x_of(done["_p"].to_numpy()), done["final_val_loss"], s=10, alpha=0.35,
               color=color, lw=0)
    stats = [(p, *t_interval(d["final_val_loss"], conf))
             for p, d in done.groupby("_p")]
    if stats:
        p, m, lo, hi = map(np.array, zip(*stats))
        err = np.nan_to_num(np.vstack([m - lo, hi - m]))  # n = 1: no bar
        fin = np.isfinite(p)  # no line across the break to p = inf
        for part, label in ((fin, name), (~fin, None)):
            if part.any():
                ax.errorbar(x_of(p[part]), m[part], yerr=err[:, part], color=color,
                            marker="o", ms=4, capsize=3, lw=1.2, label=label)
    stopped = g[g["status"] == "stopped"]  # ASHA-stopped: last val loss, step reached
    if len(stopped):
        ax.scatter(x_of(stopped["_p"].to_numpy()), stopped["final_val_loss"], s=28,
                   facecolors="none", edgecolors=color, lw=1.0,
                   label=f"stopped early ({name})" if name else "stopped early (ASHA)")
        if "last_step" in stopped.columns and len(stopped) <= 40:
            for x, y, st in zip(x_of(stopped["_p"].to_numpy()), stopped["final_val_loss"],
                                stopped["last_step"]):
                if np.isfinite(y) and pd.notna(st):
                    ax.annotate(f"@{int(st)}", (x, y), xytext=(3, 3), fontsize=6,
                                textcoords="offset points", color=color)
    div = g[g["status"] == "diverged"]
    if len(div):
        ax.plot(x_of(div["_p"].to_numpy()), np.full(len(div), 0.96 - 0.03 * i), "x",
                color=color, ms=7, mew=2, transform=ax.get_xaxis_transform(),
                label=f"diverged ({name})" if name else "diverged")


def _p_axis(ax, finite: np.ndarray, lo_p: float, hi_p: float, x_inf: float,
            has_inf: bool) -> None:
    """The log p axis: ticks at the finite p (or powers of 2), and p = inf at ``x_inf`` behind
    an explicit axis break."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = list(finite) if len(finite) <= 10 else [
        2.0 ** k for k in range(math.floor(math.log2(lo_p)), math.ceil(math.log2(hi_p)) + 1)]
    # every p inside the axes (p = inf was drawn half-clipped at the edge: issue 17 §4)
    ax.set_xlim(lo_p / 1.6, (x_inf if has_inf else hi_p) * 1.6)
    if has_inf:  # an explicit axis break between the finite p and p = inf
        x_break = math.sqrt(hi_p * x_inf)
        ax.axvline(x_break, color="0.6", ls=":", lw=1)
        for y in (0.0, 1.0):
            ax.text(x_break, y, "//", transform=ax.get_xaxis_transform(), ha="center",
                    va="center", fontsize=11, backgroundcolor="white", clip_on=False)
    ax.set_xticks(ticks + ([x_inf] if has_inf else []),
                  [f"{v:g}" for v in ticks] + (["inf"] if has_inf else []))


def _reference_levels(ax, t: pd.DataFrame, ref: list[str], arms: list[str], colors,
                      conf: float) -> None:
    """Arms without p (e.g. pre_ln): a dashed level with its CI each; past MAX_CURVE_ARMS
    such arms (a search) one level per family, over its completed trials."""
    full = short_labels(arms)
    groups: dict[str, list[str]] = {}
    for a in ref:
        kv = _parse_arm(a) or {}
        fam = next((v for k, v in kv.items() if k.endswith(".family")), a)
        groups.setdefault(fam if len(ref) > MAX_CURVE_ARMS else full[a], []).append(a)
    done = t[t["status"] == "completed"]
    for name, members in groups.items():
        m, lo, hi = t_interval(done.loc[done["arm"].isin(members), "final_val_loss"], conf)
        if not math.isnan(m):
            ax.axhline(m, color=colors[members[0]], ls="--", lw=1, label=name)
            if not math.isnan(lo):
                ax.axhspan(lo, hi, color=colors[members[0]], alpha=0.12, lw=0)


def _fig_val_vs_p(data: SweepData, cfg: ReportConfig, arms, colors, path) -> str | None:
    t, col = data.trials, cfg.p_column
    if col not in t.columns:
        return f"validation loss vs p: no `{col}` column in the trials"
    t = t.assign(_p=pd.to_numeric(t[col], errors="coerce"))  # 'inf' strings parse to inf
    with_p = t[t["_p"].notna()]
    if with_p["_p"].nunique() < 2:
        return f"validation loss vs p: `{col}` does not vary"
    finite = np.sort(with_p.loc[np.isfinite(with_p["_p"]), "_p"].unique())
    lo_p, hi_p = (finite[0], finite[-1]) if len(finite) else (1.0, 1.0)
    x_inf = hi_p * max(4.0, (hi_p / lo_p) ** 0.2)  # p = inf: its own tick right of the axis

    def x_of(v):
        return np.where(np.isfinite(v), v, x_inf)

    fig = _figure(7, 4.8)
    ax = fig.subplots()
    has_p = set(with_p["arm"])
    p_arms = [a for a in arms if a in has_p]
    names = short_labels(p_arms, drop=col)
    series: dict[str, list[str]] = {}
    # a search has an arm per trial: more series than a legend can name (and 1,000 errorbar
    # artists) would draw for minutes, so past MAX_CURVE_ARMS series are families
    by_family = len(set(names.values())) > MAX_CURVE_ARMS
    for a in p_arms:  # nothing but p varies: name the series by its family
        kv = _parse_arm(a) or {}
        family = next((v for k, v in kv.items() if k.endswith(".family")), "all")
        series.setdefault(family if by_family else (names[a] or family), []).append(a)
    for i, (name, members) in enumerate(series.items()):
        _draw_p_series(ax, with_p[with_p["arm"].isin(members)], x_of, colors[members[0]], name,
                       i, cfg.conf)
    in_p = set(p_arms)
    _reference_levels(ax, t, [a for a in arms if a not in in_p], arms, colors,
                      cfg.conf)
    has_inf = bool(np.isinf(with_p["_p"]).any())
    _p_axis(ax, finite, lo_p, hi_p, x_inf, has_inf)
    ax.set(xlabel=f"p ({col})", ylabel="final validation loss",
           title=f"val loss vs p: mean, {cfg.conf:.0%} CI; o = stopped early (@step), "
                 "x = diverged")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
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
        fig = _figure(1.2 + 2.4 * len(modules), 0.9 + 1.7 * len(shown))
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
                if j == 0:
                    ax.set_ylabel(labels[arm], fontsize=7)
        if im is not None:
            fig.colorbar(im, ax=axes, shrink=0.8)
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
    labels, colors = short_labels(arms), _colors(arms)
    made, skipped = [], []
    with stage("figure loss curves"):
        why = _fig_loss_curves(data, cfg, arms, labels, colors, out / "loss_curves.png")
    made += [] if why else [("Loss curves per arm", "loss_curves.png")]
    skipped += [why] if why else []
    with stage("figure val vs p"):
        why = _fig_val_vs_p(data, cfg, arms, colors, out / "val_vs_p.png")
    made += [] if why else [("Validation loss vs p", "val_vs_p.png")]
    skipped += [why] if why else []
    with stage("figure heatmaps"):
        hm, sk = _fig_heatmaps(data, cfg, arms, labels, out)
    made, skipped = made + hm, skipped + sk
    with stage("figure growth"):
        g, sk = _fig_growth(data, cfg, arms, labels, colors, out / "growth.png")
    made, skipped = made + ([g] if g else []), skipped + sk
    return made, skipped
