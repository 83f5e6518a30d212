"""Critical lr, common lr and the p-curve on a constructed family x lr x seed sweep."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.analysis.frontier import (
    common_lr,
    critical_lr_table,
    family_labels,
    loss_at_lr,
    p_curve,
)

LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
# family -> (lrs at which a seed diverges: {lr: number of the 3 seeds diverged})
FAIL = {
    "pre_ln": {3e-2: 1, 1e-1: 3, 3e-1: 3},     # all-rule critical 1e-2; majority 3e-2
    "post_ln": {1e-2: 3, 3e-2: 3, 1e-1: 3, 3e-1: 3},
    "keel": {},                                # never diverges: a lower bound
    "bad": {lr: 3 for lr in LRS},              # diverges everywhere
}


def _trials() -> pd.DataFrame:
    rows = []
    for fam, fails in FAIL.items():
        for lr in LRS:
            for seed in range(3):
                dead = seed < fails.get(lr, 0)
                loss = math.nan if dead else 2.0 + 10 * lr + 0.01 * seed + 0.1 * (fam == "keel")
                rows.append({"model.residual.family": fam, "optim.lr": lr, "seed": seed,
                             "model.residual.p": math.nan, "final_val_loss": loss,
                             "status": "diverged" if dead else "completed"})
    for p in (0.5, 1.0, 2.0, 4.0, math.inf):  # spheret: stable to 3e-2, loss min at p = 1
        for lr in LRS:
            for seed in range(3):
                dead = lr >= 1e-1
                loss = math.nan if dead else 1.9 + 0.05 * abs(math.log2(min(p, 16.0))) + 0.02 * seed
                rows.append({"model.residual.family": "spheret", "optim.lr": lr, "seed": seed,
                             "model.residual.p": p, "final_val_loss": loss,
                             "status": "diverged" if dead else "completed"})
    return pd.DataFrame(rows)


def test_family_labels_split_spheret_by_p():
    lab = family_labels(_trials())
    assert set(lab) == {"pre_ln", "post_ln", "keel", "bad", "spheret p=0.5", "spheret p=1",
                        "spheret p=2", "spheret p=4", "spheret p=inf"}


def test_a_swept_step_init_splits_the_family_and_the_p_curve():
    """norm_ablation crosses alpha_init with family and lr (issue 30): every init is its own
    frontier row and its own p-curve, not pooled with the other."""
    t = _trials()
    sp = t[t["model.residual.family"] == "spheret"]
    t2 = pd.concat([t.assign(**{"model.residual.alpha_init": np.where(
        t["model.residual.family"] == "spheret", 1.0, np.nan)}),
        sp.assign(**{"model.residual.alpha_init": 0.05,
                     "final_val_loss": sp["final_val_loss"] + 0.3})], ignore_index=True)
    lab = set(family_labels(t2))
    assert {"spheret p=1 alpha_init=1", "spheret p=1 alpha_init=0.05", "pre_ln"} <= lab
    tab = critical_lr_table(t2).set_index("family")
    assert tab.loc["spheret p=inf alpha_init=0.05", "critical_lr"] == 3e-2
    pc = p_curve(t2, 1e-3)
    assert set(pc["alpha_init"]) == {1.0, 0.05} and len(pc) == 10
    one = pc[(pc["alpha_init"] == 0.05) & (pc["p"] == 1.0)].iloc[0]
    assert one["mean"] == pytest.approx(1.9 + 0.3 + 0.02)  # seeds add 0, 0.02, 0.04


def test_critical_lr_all_and_majority():
    t = _trials()
    tab = critical_lr_table(t, "all").set_index("family")
    assert tab.loc["pre_ln", "critical_lr"] == 1e-2
    assert tab.loc["pre_ln", "stable_at_critical"] == "3/3"
    assert tab.loc["pre_ln", "first_unstable_lr"] == 3e-2
    assert tab.loc["pre_ln", "stable_at_first_unstable"] == "2/3"
    assert tab.loc["post_ln", "critical_lr"] == 3e-3
    assert tab.loc["keel", "critical_lr"] == 3e-1 and "lower bound" in tab.loc["keel", "note"]
    assert math.isnan(tab.loc["bad", "critical_lr"]) and "smallest" in tab.loc["bad", "note"]
    assert tab.loc["spheret p=1", "critical_lr"] == 3e-2
    assert (tab["n_lrs"] == 6).all()
    maj = critical_lr_table(t, "majority").set_index("family")
    assert maj.loc["pre_ln", "critical_lr"] == 3e-2


def test_not_monotone_is_flagged():
    t = _trials()
    t.loc[(t["model.residual.family"] == "bad") & (t["optim.lr"] == 3e-1), "status"] = "completed"
    t.loc[(t["model.residual.family"] == "bad") & (t["optim.lr"] == 3e-1), "final_val_loss"] = 5.0
    tab = critical_lr_table(t).set_index("family")
    assert "not monotone" in tab.loc["bad", "note"]


def test_common_lr_loss_and_p_curve():
    t = _trials()
    t = t[t["model.residual.family"] != "bad"]
    # stable for all families: 1e-3 and 3e-3 (post_ln dies at 1e-2); lower loss at 1e-3
    assert common_lr(t) == 1e-3
    loss = loss_at_lr(t, 1e-3).set_index("family")
    assert loss.loc["pre_ln", "n"] == 3
    assert loss.loc["pre_ln", "mean"] == pytest.approx(2.0 + 1e-2 + 0.01)
    sd = np.std([0.0, 0.01, 0.02], ddof=1)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert loss.loc["pre_ln", "hi"] - loss.loc["pre_ln", "mean"] == pytest.approx(half)
    pc = p_curve(t, 1e-3).set_index("p")
    assert list(pc.index) == [0.5, 1.0, 2.0, 4.0, math.inf]
    assert pc["mean"].idxmin() == 1.0
    assert pc.loc[math.inf, "mean"] == pytest.approx(1.9 + 0.05 * 4 + 0.02)
    # "bad" is stable nowhere: it is named and left out, the others keep their common lr
    from orchestrator.analysis.frontier import never_stable

    assert never_stable(_trials()) == ["bad"] and never_stable(t) == []
    assert common_lr(_trials()) == 1e-3
