"""Leaderboard, search figures and parameter importance on a constructed trials table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.importance import param_importance, study_from_trials
from orchestrator.analysis.leaderboard import leaderboard, searched_params
from orchestrator.analysis.search_figures import (
    axis_values,
    fig_objective_vs_params,
    fig_parallel,
)


def _trials(n: int = 24) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    lr = 10 ** rng.uniform(-4, -2, n)
    fam = np.where(np.arange(n) % 3 == 0, "pre_ln", "spheret")
    p = [None if f == "pre_ln" else (math.inf if i % 5 == 1 else float(2 ** (i % 4)))
         for i, f in enumerate(fam)]
    loss = 1.5 + (np.log10(lr) + 3) ** 2  # only lr matters
    status = np.array(["completed"] * n, dtype=object)
    status[[2, 7]] = "diverged"
    status[[4]] = "stopped"
    status[[9]] = "failed"
    return pd.DataFrame({
        "trial": [f"t{i:02d}" for i in range(n)], "status": status, "seed": 0,
        "objective": np.where(status == "diverged", 10.8, loss),
        "final_val_loss": loss, "best_val_loss": loss - 0.01,
        "last_step": np.where(status == "stopped", 50, 200), "divergence_reason": None,
        "model.residual.family": fam, "model.residual.p": p, "optim.lr": lr,
        "train.seed": 0, "val/loss": loss, "arm": "x"})


def test_leaderboard_ranks_by_objective_and_puts_bad_trials_last():
    t = _trials()
    assert searched_params(t) == ["model.residual.family", "model.residual.p", "optim.lr"]
    board = leaderboard(t, top=len(t))
    good = t[~t["status"].isin(["diverged", "failed"])].sort_values("objective")
    assert board["trial"].tolist()[: len(good)] == good["trial"].tolist()
    assert set(board["trial"].tolist()[-3:]) == {"t02", "t07", "t09"}
    assert board["rank"].tolist() == list(range(1, len(t) + 1))
    row = board.set_index("trial").loc["t04"]
    assert row["status"] == "stopped" and row["step"] == 50
    assert board.columns.tolist()[-3:] == ["model.residual.family", "model.residual.p",
                                           "optim.lr"]
    top = leaderboard(t, top=3, mode="max")
    assert top["objective"].tolist() == sorted(good["objective"], reverse=True)[:3]


def test_axis_values_log_inf_and_categories():
    x, ticks, labels, log = axis_values(pd.Series([1.0, 4.0, 16.0, math.inf, None]))
    assert log and labels[-1] == "inf" and x[3] == ticks[-1] > 16.0 and math.isnan(x[4])
    x, ticks, labels, log = axis_values(pd.Series(["b", "a", None]))
    assert not log and labels == ["a", "b"] and x[:2].tolist() == [1.0, 0.0]


def test_figures_are_written(tmp_path):
    t = _trials()
    assert fig_objective_vs_params(t, tmp_path / "o.png") is None
    assert fig_parallel(t, tmp_path / "p.png") is None
    assert (tmp_path / "o.png").stat().st_size > 10_000
    assert (tmp_path / "p.png").stat().st_size > 10_000
    flat = t.assign(**{"optim.lr": 1e-3, "model.residual.family": "x",
                       "model.residual.p": 1.0})
    assert "no searched parameter" in fig_parallel(flat, tmp_path / "q.png")


def test_importance_from_the_trials_table_finds_the_parameter_that_matters():
    t = _trials(40)
    study, dropped = study_from_trials(t)
    assert len(study.trials) == 40 - 4  # completed only (no stopped, diverged, failed)
    assert dropped == []  # p has inf: categorical, with "absent" for pre_ln
    assert set(study.trials[0].params) == {"model.residual.family", "model.residual.p",
                                           "optim.lr"}
    imps, note = param_importance(t)
    assert next(iter(imps)) == "optim.lr" and imps["optim.lr"] > 0.8
    assert note.startswith("fANOVA (Optuna) over 36 completed trials")
    assert sum(imps.values()) == pytest.approx(1.0)


def test_importance_needs_trials():
    t = _trials()
    t.loc[t.index[2:], "status"] = "diverged"  # two completed trials left
    imps, note = param_importance(t)
    assert imps is None and "needs >= 3 completed" in note and "found 2" in note
