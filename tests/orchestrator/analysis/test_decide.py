"""Seeds until decided (issue 17 §5) on constructed data: each arm's state, the seeds added."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from orchestrator.analysis.decide import decide, seeds_to_add
from orchestrator.analysis.stats import holm

BASE = [3.00, 3.10, 2.95, 3.05]
ARMS = {
    "better": [2.50, 2.61, 2.44, 2.56],          # -0.5, tight: significant
    "same": [3.001, 3.099, 2.951, 3.049],        # differences +-0.001: MDE tiny, equivalent
    "noisy": [2.90, 3.30, 2.80, 3.20],           # differences -0.1 .. +0.25: undecided
    "spent": [2.90, 3.30, 2.80, 3.20, 3.0, 3.1],  # as noisy, but 6 seeds = the budget
}


def _trials() -> pd.DataFrame:
    rows = [("base", s, "completed", v) for s, v in enumerate(BASE)]
    for arm, vals in ARMS.items():
        rows += [(arm, s, "completed", v) for s, v in enumerate(vals)]
    rows += [("noisy", 9, "diverged", math.nan)]  # counted as a seed run, not compared
    return pd.DataFrame(rows, columns=["arm", "seed", "status", "final_val_loss"])


def test_states_follow_holm_and_the_mde():
    ds = {d.arm: d for d in decide(_trials(), "base", effect=0.02, max_seeds=6)}
    assert {a: d.state for a, d in ds.items()} == {
        "better": "better", "same": "equivalent", "noisy": "undecided", "spent": "budget"}
    raw = [st.ttest_rel(ARMS[a][:4], BASE).pvalue for a in ARMS]
    assert [ds[a].p_holm for a in ARMS] == pytest.approx(holm(raw))
    d = np.subtract(ARMS["noisy"], BASE)
    want = (st.t.ppf(0.975, 3) + st.t.ppf(0.8, 3)) * d.std(ddof=1) / math.sqrt(4)
    assert ds["noisy"].mde == pytest.approx(want)
    assert ds["noisy"].lo < 0 < ds["noisy"].hi and ds["noisy"].mde > 0.02
    assert (ds["noisy"].n, ds["noisy"].seeds) == (4, 5)
    assert ds["same"].mde < 0.02


def test_seeds_to_add_only_to_undecided_arms_and_the_baseline():
    ds = decide(_trials(), "base", effect=0.02, max_seeds=6)
    assert seeds_to_add(ds, "base", per_round=2, max_seeds=6) == {"noisy": 1, "base": 1}
    assert seeds_to_add(ds, "base", per_round=2, max_seeds=8) == {"noisy": 2, "base": 2}
    # a looser effect decides the noisy arm as equivalent: nothing to add
    loose = decide(_trials(), "base", effect=1.0, max_seeds=6)
    assert {d.arm: d.state for d in loose}["noisy"] == "equivalent"
    assert seeds_to_add(loose, "base", per_round=2, max_seeds=6) == {}
