"""The report's ``val_vs_p.png``: final validation loss against the SpheretNorm exponent p.

What it draws and what it refuses to: a completed trial is a point; where a p has 2 or more
completed trials, their mean and t-interval. An ASHA-stopped trial is an open marker at its last
val loss with the step it reached (@step). A diverged trial has no loss to draw (its objective
is a penalty), so it is an x in a labelled band above the data, never on the loss axis; a trial
that ended before its first evaluation is not drawn and the title says how many. p = inf sits
right of the finite values behind an axis break. Ticks never overlap (figure_marks.value_ticks).

Series: one per value of the other varying params when those are a small grid (``lr=1e-3``,
``lr=3e-3``), else (a search: every trial its own lr) one per residual family, so the legend
names a few series, not a trial each. Arms without p (pre_ln) are dashed reference levels.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from orchestrator.analysis.arm_labels import _parse_arm, short_labels
from orchestrator.analysis.figure_marks import diverged_strip, fmt_value, value_ticks
from orchestrator.analysis.load import ReportConfig, SweepData
from orchestrator.analysis.stats import t_interval

__all__ = ["fig_val_vs_p", "reference_levels", "MAX_SERIES", "MAX_LEVELS"]

MAX_SERIES = 6  # more named series than this (or one point each): series by family
MAX_LEVELS = 12  # reference arms past this: one level per family


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _family(arm: str) -> str:
    kv = _parse_arm(arm) or {}
    return next((v for k, v in kv.items() if k.endswith(".family")), "all")


def _series(with_p: pd.DataFrame, p_arms: list[str], col: str) -> dict[str, list[str]]:
    """Series name -> its arms (see the module docstring)."""
    names = short_labels(p_arms, drop=col)
    by_name: dict[str, list[str]] = {}
    for a in p_arms:
        by_name.setdefault(names[a] or _family(a), []).append(a)
    n_p = {k: with_p.loc[with_p["arm"].isin(v), "_p"].nunique() for k, v in by_name.items()}
    if len(by_name) <= MAX_SERIES and max(n_p.values(), default=0) > 1:
        return by_name
    by_family: dict[str, list[str]] = {}
    for a in p_arms:
        by_family.setdefault(_family(a), []).append(a)
    if list(by_family) == ["all"]:  # one family, not in the arm labels: what the points are
        return {"completed": by_family["all"]}
    return by_family


def _draw_series(ax, g: pd.DataFrame, x_of, color, name: str, conf: float) -> bool:
    """Completed points, mean and CI per p with 2+ of them, ASHA-stopped trials (@step);
    True when an interval was drawn."""
    done = g[(g["status"] == "completed") & g["final_val_loss"].notna()]
    ax.scatter(x_of(done["_p"].to_numpy()), done["final_val_loss"], s=22, alpha=0.8,
               color=color, lw=0, label=name)
    stats = [(p, *t_interval(d["final_val_loss"], conf)) for p, d in done.groupby("_p")
             if len(d) >= 2]
    if stats:
        p, m, lo, hi = map(np.array, zip(*stats))
        err = np.vstack([m - lo, hi - m])
        fin = np.isfinite(p)  # no line across the break to p = inf
        for part in (fin, ~fin):
            if part.any():
                ax.errorbar(x_of(p[part]), m[part], yerr=err[:, part], color=color,
                            marker="o", ms=4, capsize=3, lw=1.2)
    stopped = g[(g["status"] == "stopped") & g["final_val_loss"].notna()]
    if len(stopped):
        ax.scatter(x_of(stopped["_p"].to_numpy()), stopped["final_val_loss"], s=28,
                   facecolors="none", edgecolors=color, lw=1.0)
        if "last_step" in stopped.columns and len(stopped) <= 40:
            for x, y, st in zip(x_of(stopped["_p"].to_numpy()), stopped["final_val_loss"],
                                stopped["last_step"]):
                if pd.notna(st):
                    ax.annotate(f"@{int(st)}", (x, y), xytext=(3, 3), fontsize=6,
                                textcoords="offset points", color=color)
    return bool(stats)


def _p_axis(ax, finite: np.ndarray, lo_p: float, hi_p: float, x_inf: float,
            has_inf: bool) -> None:
    """The log p axis: non-overlapping ticks, p = inf at ``x_inf`` behind an axis break."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = value_ticks(finite)
    ax.set_xlim(lo_p / 1.6, (x_inf if has_inf else hi_p) * 1.6)
    if has_inf:  # an explicit axis break between the finite p and p = inf
        x_break = math.sqrt(hi_p * x_inf)
        ax.axvline(x_break, color="0.6", ls=":", lw=1)
        for y in (0.0, 1.0):
            ax.text(x_break, y, "//", transform=ax.get_xaxis_transform(), ha="center",
                    va="center", fontsize=11, backgroundcolor="white", clip_on=False)
    ax.set_xticks(ticks + ([x_inf] if has_inf else []),
                  [fmt_value(v) for v in ticks] + (["inf"] if has_inf else []))


def reference_levels(ax, t: pd.DataFrame, ref: list[str], arms: list[str], colors,
                     conf: float) -> None:
    """Arms without p (e.g. pre_ln): a dashed level with its CI each; past MAX_LEVELS such
    arms (a search) one level per family, over its completed trials."""
    full = short_labels(arms)
    groups: dict[str, list[str]] = {}
    for a in ref:
        kv = _parse_arm(a) or {}
        fam = next((v for k, v in kv.items() if k.endswith(".family")), a)
        groups.setdefault(fam if len(ref) > MAX_LEVELS else full[a], []).append(a)
    done = t[t["status"] == "completed"]
    for name, members in groups.items():
        m, lo, hi = t_interval(done.loc[done["arm"].isin(members), "final_val_loss"], conf)
        if not math.isnan(m):
            ax.axhline(m, color=colors[members[0]], ls="--", lw=1, label=name)
            if not math.isnan(lo):
                ax.axhspan(lo, hi, color=colors[members[0]], alpha=0.12, lw=0)


def fig_val_vs_p(data: SweepData, cfg: ReportConfig, arms, colors, path) -> str | None:
    """Draw ``path``; returns why it was skipped, or None."""
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
    series = _series(with_p, p_arms, col)
    has_ci = False
    for name, members in series.items():
        has_ci |= _draw_series(ax, with_p[with_p["arm"].isin(members)], x_of,
                               colors[members[0]], name, cfg.conf)
    in_p = set(p_arms)
    reference_levels(ax, t, [a for a in arms if a not in in_p], arms, colors, cfg.conf)
    ended = with_p["status"].isin(("completed", "stopped"))
    drawn = pd.concat([with_p.loc[ended, "final_val_loss"],
                       t.loc[(t["status"] == "completed") & ~t["arm"].isin(in_p),
                             "final_val_loss"]]).dropna()
    lo, hi = (float(drawn.min()), float(drawn.max())) if len(drawn) else (0.0, 1.0)
    div = with_p[with_p["status"] == "diverged"]
    if len(div):  # no loss to draw: a mark in the band above the data
        y = diverged_strip(ax, lo, hi)
        ax.plot(x_of(div["_p"].to_numpy()), np.full(len(div), y), "x", color="red", ms=7,
                mew=2, label=f"diverged ({len(div)})")
    never = int((ended & with_p["final_val_loss"].isna()).sum())
    _p_axis(ax, finite, lo_p, hi_p, x_inf, bool(np.isinf(with_p["_p"]).any()))
    what = (f"mean and {cfg.conf:.0%} CI where a p has 2+ trials" if has_ci else
            "one completed trial per point (no intervals)")
    notes = ["o = stopped early (@step)"] + (
        [f"{never} never evaluated, not drawn"] if never else [])
    ax.set(xlabel=f"p ({col})", ylabel="final validation loss")
    ax.set_title(f"val loss vs p: {what}\n" + "; ".join(notes), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path)
    return None
