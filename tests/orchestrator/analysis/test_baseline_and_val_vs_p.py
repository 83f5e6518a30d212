"""issue 17 §4: the report's baseline is never a diverged arm; ASHA-stopped trials stay in the
arms table; ``val_vs_p`` shows every p, p = inf inside the axes behind an axis break."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis import val_vs_p as F
from orchestrator.analysis.baseline import choose_baseline
from orchestrator.analysis.load import ReportConfig, ReportError, SweepData
from orchestrator.analysis.tables import _arms_md, arm_table

pytestmark = pytest.mark.timeout(120)

A = "model.residual.p=2,optim.lr=0.001"
B = "model.residual.p=8,optim.lr=0.003"
C = "model.residual.p=inf,optim.lr=0.001"
D = "model.residual.p=0.5,optim.lr=1"


def _trials(rows) -> pd.DataFrame:
    out = []
    for i, (arm, status, loss, step) in enumerate(rows):
        p = float(arm.split(",")[0].split("=")[1])
        out.append({"trial": f"t{i}", "arm": arm, "seed": i, "status": status,
                    "final_val_loss": loss, "best_val_loss": loss, "last_step": step,
                    "model.residual.p": p, "divergence_step": 3 if status == "diverged"
                    else np.nan, "divergence_reason": None})
    return pd.DataFrame(out)


# the quickstart failure: a diverged arm first, most finite p stopped by ASHA
ROWS = [(D, "diverged", np.nan, 3), (C, "completed", 2.40, 100), (A, "completed", 2.30, 100),
        (A, "stopped", 2.60, 25), (B, "stopped", 2.50, 50), (C, "completed", 2.45, 100)]


def test_baseline_is_the_best_completed_arm_never_a_diverged_one():
    t = _trials(ROWS)
    assert choose_baseline(t, "final_val_loss") == A  # 2.30 < mean(2.40, 2.45)
    assert choose_baseline(t, "final_val_loss", baseline=C) == C
    assert choose_baseline(t, "final_val_loss", named={"model.residual.p": "inf"}) == C
    assert choose_baseline(t, "final_val_loss", named=B) == B
    with pytest.raises(ReportError, match=r"report\.baseline: .* matches 0 arms"):
        choose_baseline(t, "final_val_loss", named={"model.residual.p": 3})
    with pytest.raises(ReportError, match="--baseline: unknown arm"):
        choose_baseline(t, "final_val_loss", baseline="nope")
    nothing = _trials([(D, "diverged", np.nan, 3), (B, "stopped", 2.5, 50)])
    assert choose_baseline(nothing, "final_val_loss") == D  # nothing completed: first arm


def _data(t: pd.DataFrame) -> SweepData:
    empty = pd.DataFrame(columns=["trial", "step", "split", "metric", "value"])
    return SweepData("s", Path("."), ".", {}, t, empty, empty)


def test_arms_table_keeps_stopped_trials_with_their_step():
    arms = arm_table(_data(_trials(ROWS))).set_index("arm")
    assert bool(arms.loc[A, "baseline"]) and not bool(arms.loc[D, "baseline"])
    assert (arms.loc[B, "n_stopped"], arms.loc[B, "stopped_step"]) == (1, 50.0)
    assert arms.loc[B, "stopped_val"] == pytest.approx(2.5)
    assert (arms.loc[A, "n_completed"], arms.loc[A, "n_stopped"]) == (1, 1)
    assert (arms.loc[D, "n_diverged"], arms.loc[D, "n_completed"]) == (1, 0)
    md = _arms_md(arm_table(_data(_trials(ROWS)))).set_index("arm")
    assert md.loc[B, "stopped early (ASHA)"] == "1 @ step 50: val 2.5"
    assert md.loc[B, "done/stopped/div/fail"] == "0/1/0/0"


def test_val_vs_p_shows_every_p_and_inf_inside_the_axes(tmp_path, monkeypatch):
    figs = []
    real = F._figure

    def capture(w, h):
        figs.append(real(w, h))
        return figs[-1]

    monkeypatch.setattr(F, "_figure", capture)
    t = _trials(ROWS)
    t["arm"] = "model.residual.family=spheret"  # one series, p on the x axis
    why = F.fig_val_vs_p(_data(t), ReportConfig(), ["model.residual.family=spheret"],
                          {"model.residual.family=spheret": "C0"}, tmp_path / "v.png")
    assert why is None and (tmp_path / "v.png").stat().st_size > 5000
    ax = figs[0].axes[0]
    xs = set()
    for coll in ax.collections:
        xs |= {round(float(x), 6) for x in np.asarray(coll.get_offsets())[:, 0]}
    for line in ax.lines:
        xs |= {round(float(x), 6) for x in np.asarray(line.get_xdata(), dtype=float)}
    lo, hi = ax.get_xlim()
    labels = [tk.get_text() for tk in ax.get_xticklabels()]
    x_inf = ax.get_xticks()[labels.index("inf")]
    assert lo < 0.5 and x_inf * 1.2 < hi  # p = 0.5 and inf both well inside the axes
    for p in (2.0, 8.0):  # 8 was only ASHA-stopped: drawn as an open marker
        assert p in xs, (p, xs)
    assert any(x == pytest.approx(x_inf) for x in xs)
    assert any(t.get_text() == "//" for t in ax.texts)  # the axis break
    assert any(t.get_text() == "@50" for t in ax.texts)  # the step an ASHA trial reached
    assert not math.isnan(lo)
