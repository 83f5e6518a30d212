"""Figures made for searches (a trial per point, not an arm per line): the objective against
each searched parameter, and parallel coordinates of every trial.

Stopped (ASHA) trials are drawn too, as hollow grey circles: their value is the one at the
step they reached, so it is not comparable with a completed trial's, but where the scheduler
cut matters. Diverged trials are red crosses in a labelled band above the data (their objective
is a penalty, not a loss: figure_marks.diverged_strip); a trial whose value lies above the
plotted range (its 98th percentile) is a triangle at the range's top edge, counted in the
legend. Colour is the objective, dark = lower (viridis), with a colour bar, in both figures.
p = inf gets its own tick right of the finite values. One Agg figure each, line collections
instead of a line per trial, so 1,000 trials cost what 10 do.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.analysis.figure_marks import diverged_strip, fmt_value
from orchestrator.analysis.leaderboard import rank_value, searched_params

__all__ = ["axis_values", "fig_objective_vs_params", "fig_parallel"]


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def axis_values(col: pd.Series) -> tuple[np.ndarray, list[float], list[str], bool]:
    """A param column as plot positions: (x, tick positions, tick labels, log scale).

    Numbers (``inf`` included) stay numbers, on a log axis when positive and spanning at least
    10x, with ``inf`` at a tick right of the largest finite value; anything else is a category
    at 0, 1, 2, ... in sorted order. Missing values (a conditional param) are NaN.
    """
    num = pd.to_numeric(col, errors="coerce")
    if num.notna().sum() == col.notna().sum() and num.notna().any():
        x = num.to_numpy(dtype=float)
        fin = x[np.isfinite(x)]
        log = bool(len(fin)) and fin.min() > 0 and fin.max() >= 10 * fin.min()
        hi = fin.max() if len(fin) else 1.0
        lo = fin.min() if len(fin) else 1.0
        x_inf = hi * max(4.0, (hi / lo) ** 0.2) if log else hi + max(1.0, 0.2 * (hi - lo))
        has_inf = bool(np.isinf(x).any())
        x = np.where(np.isinf(x), x_inf, x)
        if log:
            ticks = [10.0 ** k for k in range(math.ceil(math.log10(lo) - 1e-9),
                                              math.floor(math.log10(hi) + 1e-9) + 1)]
            ticks = ticks if len(ticks) >= 2 else [lo, hi]
        else:
            ticks = list(np.linspace(lo, hi, 5)) if hi > lo else [lo]
        labels = [f"{t:g}" for t in ticks]
        if has_inf:
            ticks, labels = ticks + [x_inf], labels + ["inf"]
        return x, ticks, labels, log
    cats = sorted(col.dropna().astype(str).unique())
    pos = {c: float(i) for i, c in enumerate(cats)}
    x = np.array([pos.get(str(v), np.nan) if v is not None and v == v else np.nan
                  for v in col], dtype=float)
    return x, list(pos.values()), cats, False


def _groups(trials: pd.DataFrame) -> dict[str, np.ndarray]:
    s = trials["status"].to_numpy()
    return {"completed": s == "completed", "stopped": s == "stopped",
            "diverged": np.isin(s, ("diverged", "failed"))}


def _searched(trials: pd.DataFrame) -> tuple[list[str], np.ndarray, dict, np.ndarray]:
    """What both search figures start from: the searched params, the objective per trial,
    the status groups and which trials have a finite, non-diverged objective."""
    params = searched_params(trials)
    y = rank_value(trials).to_numpy(dtype=float)
    g = _groups(trials)
    return params, y, g, np.isfinite(y) & ~g["diverged"]


def fig_objective_vs_params(trials: pd.DataFrame, path: Path,
                            label: str = "objective") -> str | None:
    """One panel per searched param; returns why it was skipped, or None."""
    params, y, g, ok = _searched(trials)
    if not params:
        return "objective vs parameters: no searched parameter varies"
    ylo, yhi = (np.nanmin(y[ok]), np.nanquantile(y[ok], 0.98)) if ok.any() else (0.0, 1.0)
    cols = min(3, len(params))
    rows = math.ceil(len(params) / cols)
    fig = _figure(4.2 * cols, 3.4 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    over = ok & (y > yhi)  # above the plotted range: at its edge, counted
    for ax, p in zip(axes, params):
        x, ticks, labels, log = axis_values(trials[p])
        has = np.isfinite(x)
        m = has & g["completed"] & ok & ~over
        sc = ax.scatter(x[m], y[m], s=14, c=y[m], cmap="viridis", vmin=ylo, vmax=yhi,
                        lw=0, label="completed")
        m = has & g["stopped"] & ok & ~over
        ax.scatter(x[m], y[m], s=16, facecolors="none", edgecolors="0.45", lw=0.8,
                   label="stopped (ASHA)")
        m = has & over
        if over.any():
            ax.plot(x[m], np.full(m.sum(), yhi), "^", color="0.3", ms=5,
                    label=f"above the range ({int(over.sum())})")
        top = diverged_strip(ax, ylo, yhi) if g["diverged"].any() else None
        m = has & g["diverged"]
        if top is not None:
            ax.plot(x[m], np.full(m.sum(), top), "x", color="red", ms=5, mew=1.2,
                    label=f"diverged / failed ({int(g['diverged'].sum())})")
        elif yhi > ylo:
            pad = 0.06 * (yhi - ylo)
            ax.set_ylim(ylo - pad, yhi + pad)
        if log:
            ax.set_xscale("log")
            from matplotlib.ticker import NullLocator

            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set(xlabel=p, ylabel=label)
        ax.grid(alpha=0.3)
    for ax in axes[len(params):]:
        ax.set_axis_off()
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=3, fontsize=7)
    fig.colorbar(sc, ax=list(axes[: len(params)]), shrink=0.8, label=f"{label} (dark = lower)")
    fig.suptitle(f"{label} vs each searched parameter ({len(trials)} trials)", fontsize=9)
    fig.savefig(path)
    return None


def fig_parallel(trials: pd.DataFrame, path: Path, label: str = "objective") -> str | None:
    """Parallel coordinates: an axis per searched param and one for the objective; a trial is
    a polyline coloured by its objective (diverged: red, dashed; stopped: grey)."""
    from matplotlib.collections import LineCollection

    params, y, g, ok = _searched(trials)
    if not params:
        return "parallel coordinates: no searched parameter varies"
    cols, names, ends = [], [], []
    for p in params:
        x, ticks, labels, log = axis_values(trials[p])
        f = (lambda v: np.log10(v)) if log else (lambda v: v)
        lo, hi = f(np.nanmin(x)), f(np.nanmax(x))
        ends.append(_ends(trials[p], x, ticks, labels))
        span = hi - lo if hi > lo else 1.0
        cols.append((f(x) - lo) / span)  # NaN where the param is absent: the line breaks
        names.append(p.split(".")[-1] if len(p) > 14 else p)
    ylo, yhi = (np.nanmin(y[ok]), np.nanquantile(y[ok], 0.98)) if ok.any() else (0.0, 1.0)
    yspan = yhi - ylo if yhi > ylo else 1.0
    cols.append(np.where(ok, np.clip((y - ylo) / yspan, 0, 1), 1.05))
    names.append(label)
    ends.append((f"{ylo:.3g}", f"{yhi:.3g}"))
    mat = np.vstack(cols).T  # trials x axes
    xs = np.arange(mat.shape[1], dtype=float)
    fig = _figure(max(7.0, 1.8 * len(names) + 1.5), 4.8)
    ax = fig.subplots()
    from matplotlib import colormaps

    cmap = colormaps["viridis"]  # dark = lower, as in objective_vs_params.png
    for key, color, style, alpha in (("diverged", "red", "--", 0.35), ("stopped", "0.6", "-",
                                      0.35), ("completed", None, "-", 0.6)):
        idx = np.flatnonzero(g[key])
        if key == "completed":  # the best on top
            idx = idx[np.argsort(-np.nan_to_num(y[idx], nan=np.inf))]
        segs = [np.column_stack([xs, mat[i]]) for i in idx]
        if not segs:
            continue
        colors = [cmap(float(np.clip((y[i] - ylo) / yspan, 0, 1))) if color is None else color
                  for i in idx]
        ax.add_collection(LineCollection(segs, colors=colors, linestyles=style, lw=0.8,
                                         alpha=alpha, label=f"{key} ({len(idx)})"))
    for x, (bottom, top) in zip(xs, ends):  # each axis: its lowest and highest value
        ax.axvline(x, color="0.2", lw=0.8)
        ax.text(x, -0.04, bottom, ha="center", va="top", fontsize=6)
        ax.text(x, 1.015, top, ha="center", va="bottom", fontsize=6)
    ax.set_xlim(-0.2, xs[-1] + 0.2)
    ax.set_ylim(-0.1, 1.1)
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_yticks([])
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3,
               fontsize=7)
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig.colorbar(ScalarMappable(Normalize(ylo, yhi), cmap), ax=ax, shrink=0.8,
                 label=f"{label} of completed trials (dark = lower)")
    ax.set_title(f"parallel coordinates, {len(trials)} trials: colour = {label}\nstopped grey; "
                 f"diverged red, dashed, above the {label} axis", fontsize=8)
    fig.savefig(path)
    return None


def _ends(col: pd.Series, x: np.ndarray, ticks: list[float], labels: list[str]
          ) -> tuple[str, str]:
    """The labels at an axis' bottom and top: its smallest and largest value (``inf`` at the
    top when present), or the first and last category."""
    num = pd.to_numeric(col, errors="coerce")
    if num.notna().sum() == col.notna().sum() and num.notna().any():
        v = num.to_numpy(dtype=float)
        fin = v[np.isfinite(v)]
        lo = fmt_value(float(fin.min())) if len(fin) else "inf"
        hi = "inf" if np.isinf(v).any() else fmt_value(float(fin.max()))
        return lo, hi
    return (labels[0], labels[-1]) if labels else ("", "")
