"""Figures that refuse to draw what the data cannot support (issue 33 §3, §4, §6, §16), on
constructed data: no divergence boundary from too few diverged trials and none outside the
searched box; parallel coordinates dark = lower with a colour bar that says so; val vs p with
ticks that do not overlap, no value for a trial never evaluated, diverged trials above the
data, a few series for a search; objective vs params marks what it clips; one seed: no band."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from orchestrator.analysis import figures as FIG
from orchestrator.analysis import search_figures as SF
from orchestrator.analysis import val_vs_p as VP
from orchestrator.analysis.figure_marks import STRIP_LABEL, value_ticks
from orchestrator.analysis.load import ReportConfig, SweepData
from orchestrator.analysis.search_p import boundary_note, divergence_boundary, divergence_map

pytestmark = pytest.mark.timeout(120)


def _capture(monkeypatch, module) -> list:
    figs, real = [], module._figure

    def capture(w, h):
        figs.append(real(w, h))
        return figs[-1]

    monkeypatch.setattr(module, "_figure", capture)
    return figs


def _search(n: int = 8, p_col: str = "model.residual.p") -> pd.DataFrame:
    """A 1-seed search: every trial its own (p, lr); one diverged, one stopped before its
    first evaluation, two ASHA-stopped."""
    rng = np.random.default_rng(0)
    p = [0.29, 0.37, 3.5, 7.0, 7.7, 10.7, 24.1, math.inf][:n]
    lr = 10 ** rng.uniform(-3, -1.5, n)
    status = ["completed", "stopped", "stopped", "diverged", "completed", "completed",
              "stopped", "completed"][:n]
    loss = [2.6, 2.98, 2.66, np.nan, 3.1, 2.43, np.nan, 2.53][:n]
    rows = []
    for i in range(n):
        arm = f"{p_col}={p[i]:g},optim.lr={lr[i]:.6g}"
        rows.append({"trial": f"t{i}", "arm": arm, "seed": 0, "status": status[i],
                     "final_val_loss": loss[i], "best_val_loss": loss[i],
                     "objective": loss[i] if status[i] != "diverged" else 4.43,
                     "last_step": 100 if status[i] == "stopped" else 300, p_col: p[i],
                     "optim.lr": lr[i], "divergence_reason": "grad_explosion"
                     if status[i] == "diverged" else None})
    return pd.DataFrame(rows)


def _data(t: pd.DataFrame, curves: pd.DataFrame | None = None) -> SweepData:
    empty = pd.DataFrame(columns=["trial", "step", "split", "metric", "value", "wall_time"])
    return SweepData("s", Path("."), ".", {}, t, empty if curves is None else curves, empty)


def _overlaps(fig, labels) -> bool:
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in labels if t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


# --- divergence map (search-p) --------------------------------------------------------------
def _obs(n_div: int, n_ok: int) -> list[dict]:
    out = []
    for i in range(n_ok):
        out.append({"p": 2.0 ** (i % 6 - 1), "lr": 10 ** (-3.5 + 0.1 * i), "status": "completed",
                    "loss": 2.5, "trial": f"ok{i}"})
    for i in range(n_div):
        out.append({"p": 2.0 ** (i % 6 - 1), "lr": 10 ** (-1.6 + 0.05 * i), "status": "diverged",
                    "loss": None, "trial": f"d{i}"})
    return out


def test_no_boundary_from_one_diverged_trial(tmp_path):
    obs = _obs(1, 5)  # issue 33 §3: 1 diverged in 6
    assert divergence_boundary(obs) is None
    assert boundary_note(obs) == ("no boundary drawn: 1 diverged and 5 stable finite-p trials; "
                                  "a fit needs 3 of each")
    fig_path = divergence_map(obs, tmp_path / "map.png")
    assert fig_path.stat().st_size > 5000


def test_boundary_stays_inside_the_searched_box(tmp_path, monkeypatch):
    import matplotlib.figure

    made = []
    real_savefig = matplotlib.figure.Figure.savefig

    def keep(self, *a, **k):
        made.append(self)
        return real_savefig(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    obs = _obs(4, 8)
    assert divergence_boundary(obs) is not None and boundary_note(obs) is None
    divergence_map(obs, tmp_path / "map.png")
    ax = made[0].axes[0]
    fit = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(fit) == 1 and "4 diverged" in fit[0].get_label()
    xs = np.asarray(fit[0].get_xdata(), float)
    logp = [math.log2(o["p"]) for o in obs]
    assert xs.min() >= min(logp) - 1e-9 and xs.max() <= max(logp) + 1e-9
    lrs = [math.log10(o["lr"]) for o in obs]
    lo, hi = ax.get_ylim()
    assert lo >= min(lrs) - 0.2 * (max(lrs) - min(lrs)) and hi <= max(lrs) + 0.2 * (
        max(lrs) - min(lrs))  # the axis is the searched range, not the line's reach
    # with one diverged trial: no line at all, the reason on the figure instead
    made.clear()
    divergence_map(_obs(1, 5), tmp_path / "map1.png")
    ax = made[0].axes[0]
    assert not [ln for ln in ax.lines if to_rgba(ln.get_color()) == to_rgba("r")]
    assert any("no boundary drawn" in t.get_text() for t in ax.texts)


# --- parallel coordinates ---------------------------------------------------------------------
def test_parallel_coordinates_dark_is_lower(tmp_path, monkeypatch):
    figs = _capture(monkeypatch, SF)
    t = _search()
    assert SF.fig_parallel(t, tmp_path / "pc.png") is None
    fig = figs[0]
    ax = fig.axes[0]
    done = next(c for c in ax.collections if c.get_label().startswith("completed"))
    colors = done.get_colors()
    lum = colors[:, :3] @ np.array([0.299, 0.587, 0.114])
    order = t[t["status"] == "completed"].sort_values("objective", ascending=False)
    assert len(colors) == len(order)
    # drawn best last (on top): the last segment is the best trial, and the darkest
    assert lum[-1] == lum.min() and lum[0] == lum.max()
    bars = [a for a in fig.axes if a is not ax]
    assert bars and "dark = lower" in bars[0].get_ylabel()
    assert "darker" not in ax.get_title() and "brighter" not in ax.get_title()
    # each axis says its real smallest and largest value, inf on top where present
    texts = {t.get_text() for t in ax.texts}
    assert {"0.29", "inf", "2.43"} <= texts


# --- val vs p -------------------------------------------------------------------------------
def test_val_vs_p_of_a_search(tmp_path, monkeypatch):
    figs = _capture(monkeypatch, VP)
    t = _search()
    arms = list(t["arm"])
    colors = FIG._colors(arms)
    assert VP.fig_val_vs_p(_data(t), ReportConfig(), arms, colors, tmp_path / "v.png") is None
    fig = figs[0]
    ax = fig.axes[0]
    assert not _overlaps(fig, ax.get_xticklabels())  # issue 33 §6: 0.29 and 0.37 collided
    # one series (the family), not an entry per lr
    labels = [h.get_label() for h in ax.get_legend().legend_handles]
    assert len(labels) <= 3 and not any("lr=" in lab for lab in labels), labels
    # the trial stopped before its first eval has no point; the title says so
    xs = set()
    for coll in ax.collections:
        xs |= {round(float(x), 6) for x in np.asarray(coll.get_offsets())[:, 0]}
    assert 24.1 not in xs and "1 never evaluated, not drawn" in ax.get_title()
    # the diverged trial: above the dashed separator, higher than every loss drawn
    div = next(ln for ln in ax.lines if ln.get_label().startswith("diverged"))
    top = max(np.nanmax(np.asarray(c.get_offsets())[:, 1]) for c in ax.collections
              if len(c.get_offsets()))
    assert float(div.get_ydata()[0]) > top
    assert any(t.get_text() == STRIP_LABEL for t in ax.texts)
    assert "no intervals" in ax.get_title()  # one trial per point


def test_value_ticks_never_crowd():
    assert value_ticks([1, 2, 4, 8]) == [1, 2, 4, 8]  # a grid: its own values
    ticks = value_ticks([0.29, 0.37, 3.5, 7.0, 7.7, 10.7, 24.1])
    assert ticks == [0.25, 0.5, 1, 2, 4, 8, 16, 32][: len(ticks)] or all(
        b / a >= 2 for a, b in zip(ticks, ticks[1:]))
    assert len(value_ticks(list(np.geomspace(1e-3, 1e3, 50)))) <= 7


# --- objective vs params ----------------------------------------------------------------------
def test_objective_vs_params_marks_what_it_clips(tmp_path, monkeypatch):
    figs = _capture(monkeypatch, SF)
    t = _search()
    t.loc[t["trial"] == "t5", "objective"] = 40.0  # far above the rest: past the 98% range
    assert SF.fig_objective_vs_params(t, tmp_path / "o.png") is None
    ax = figs[0].axes[0]
    lab = {ln.get_label(): ln for ln in ax.lines}
    assert "above the range (1)" in lab and "diverged / failed (1)" in lab
    above, div = lab["above the range (1)"], lab["diverged / failed (1)"]
    lo, hi = ax.get_ylim()
    assert float(above.get_ydata()[0]) < float(div.get_ydata()[0]) < hi
    pts = np.concatenate([np.asarray(c.get_offsets())[:, 1] for c in ax.collections
                          if len(c.get_offsets())])
    assert float(div.get_ydata()[0]) > pts.max()
    assert any(t.get_text() == STRIP_LABEL for t in ax.texts)


# --- loss curves, heatmaps ------------------------------------------------------------------
def test_one_seed_loss_curves_have_no_band_and_trial_names(tmp_path, monkeypatch):
    figs = _capture(monkeypatch, FIG)
    t = _search(4)
    rows = [{"trial": r.trial, "step": s, "split": "train", "metric": "loss",
             "value": 3.0 - 0.001 * s, "wall_time": float(s)}
            for r in t.itertuples() for s in range(1, 21)]
    data = _data(t, pd.DataFrame(rows))
    arms = list(t["arm"])
    names = FIG.arm_names(arms)
    assert names[arms[0]] == "p=0.29 lr=" + names[arms[0]].split("lr=")[1]
    assert FIG._fig_loss_curves(data, ReportConfig(), arms, names, FIG._colors(arms),
                                tmp_path / "l.png") is None
    title = figs[0]._suptitle.get_text()
    assert "one seed per arm (no band)" in title and "band =" not in title
    legend = [h.get_label() for h in figs[0].legends[0].legend_handles]
    assert legend[0] == names[arms[0]] and "model.residual" not in legend[0]
